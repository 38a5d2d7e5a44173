"""The Modal adapter (``type: modal``); the ``modal`` SDK is imported only when one is built."""
