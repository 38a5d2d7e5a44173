"""`python -m vk_provider` runs the command line."""

from vk_provider.cli.app import main

main()
