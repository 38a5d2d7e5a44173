"""The agent's Kubernetes API client: the only package of the agent that imports
kubernetes_asyncio (``client``), and the Event recorder built on it (``events``).
"""
