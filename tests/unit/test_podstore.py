"""The pod store and watch: parsed once per change, and no sync for the echo of our write."""

from __future__ import annotations

import copy
from typing import Any

from vk_provider.controllers.podwatch import PodStore, PodWatch


def pod(version: str, phase: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u1", "resourceVersion": version},
        "spec": {"nodeName": "vk", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": phase},
    }


def test_a_view_is_parsed_once_per_stored_object() -> None:
    store = PodStore()
    store.update(pod("5"))
    first = store.view(("ns", "p"))
    assert first is not None and first is store.view(("ns", "p"))
    store.update(pod("6", "Running"))
    second = store.view(("ns", "p"))
    assert second is not None and second.phase == "Running" and second is not first
    assert [v.resource_version for v in store.views()] == ["6"]
    store.remove(("ns", "p"))
    assert store.view(("ns", "p")) is None


def test_the_echo_of_our_own_write_queues_nothing() -> None:
    store = PodStore()
    changed: list[object] = []
    watch = PodWatch(None, node_name="vk", store=store, on_change=changed.append)  # type: ignore[arg-type]
    watch._event("ADDED", pod("5"))
    assert changed == [("ns", "p")]
    store.update(pod("7", "Running"))  # our write's answer, stored by the pod writer
    watch._event("MODIFIED", pod("6"))  # an older event: nothing new
    watch._event("MODIFIED", pod("7", "Running"))  # the echo: nothing new
    assert changed == [("ns", "p")]
    watch._event("MODIFIED", pod("8", "Running"))  # someone else's change
    watch._event("DELETED", pod("8", "Running"))
    assert changed == [("ns", "p")] * 3


def test_the_store_keeps_a_compact_copy_and_hands_out_copies() -> None:
    store = PodStore()
    first = pod("5", "Running")
    first["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    store.update(first)
    kept = store.get(("ns", "p"))
    assert kept is not None
    assert "managedFields" not in kept["metadata"]
    assert "managedFields" in first["metadata"]  # the caller's object is left alone
    expected = copy.deepcopy(first)
    del expected["metadata"]["managedFields"]
    assert kept == expected  # everything else is kept
    view = store.view(("ns", "p"))
    assert view is not None and view.raw == expected and len(view.encoded) < 400
    # Neither the caller's dict nor a copy handed out changes what is stored.
    first["status"]["phase"] = "Failed"
    kept["status"]["phase"] = "Unknown"
    assert store.get(("ns", "p")) == expected
    assert [p["status"]["phase"] for p in store.values()] == ["Running"]
    assert store.remove(("ns", "p")) == expected and store.get(("ns", "p")) is None
    assert store.key_of("u1") is None
