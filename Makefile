.PHONY: demo test check

# Install everything and run the embedded default (`vk-provider demo`).
demo:
	./scripts/demo

# Install everything and run the whole test suite (static checks included).
test:
	./scripts/test

check:
	./scripts/check
