"""Out-of-process providers over gRPC: the ``grpc`` provider type and the server kit.

``server.serve(provider, address)`` runs any in-process ``Provider`` as its own process over
``proto/vkprovider/v1/provider.proto``; ``client.GrpcProvider`` (provider type ``grpc``) is the
agent's side of the same protocol. ``wire`` and ``status`` translate the models and the error
taxonomy, once for both sides; ``_gen`` is the code generated from the proto (committed, and
checked against the proto by a unit test).
"""
