"""The ``vk-provider`` command line (``app``), its REST client (``client``) and tables
(``tables``).
"""
