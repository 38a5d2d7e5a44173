"""`python -m vk_provider` runs the command line."""

from vk_provider.cli import main

main()
