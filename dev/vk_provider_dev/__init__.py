"""vk-provider-dev: the tooling to develop, test and demonstrate vk-provider on one machine.

A distribution of its own (``dev/pyproject.toml``), installed by ``scripts/bootstrap`` and
never into the image: the local control plane and the flip's components (``cluster``), the
demo and its story, and the commands that drive them (``cli``, ``local_cli``), which join
the ``vk-provider`` command line through the ``vk_provider.commands`` entry points. It uses
the product; the product never imports it (an import-linter contract).
"""
