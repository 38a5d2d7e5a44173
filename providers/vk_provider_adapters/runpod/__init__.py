"""The RunPod adapter (``type: runpod``)."""
