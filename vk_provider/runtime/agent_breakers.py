"""Wiring the providers' circuit breakers: every adapter behind its ``GuardedProvider``, and
what placement reads of the breakers.

``guard`` wraps each built provider (``preflight.build_providers``) with a ``CircuitBreaker``
configured by ``placement:``; the agent then makes every call through the wrapped ones.
``health_of`` is the launcher's ``health``: whether each breaker lets calls through, and its
recent failures, so placement prefers healthy providers.

Invariants: wiring only; one breaker per provider, never shared; the fence given is every
wrapped provider's (a replica that does not lead writes to no provider); ``health_of`` reads
the breakers when called, so placement never sees a stale state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from vk_provider.api.metrics import Metrics
from vk_provider.controllers.guarded import GuardedProvider
from vk_provider.domain.breaker import CircuitBreaker
from vk_provider.domain.contract import Provider
from vk_provider.domain.placement import ProviderHealth
from vk_provider.settings.agent import AgentConfig


def guard(
    providers: Mapping[str, Provider],
    config: AgentConfig,
    metrics: Metrics,
    *,
    fence: Callable[[str], None] = lambda operation: None,
) -> dict[str, GuardedProvider]:
    """Each provider behind a breaker of its own, its calls observed by ``metrics`` and its
    writes passing ``fence`` first (leader election's)."""
    settings = config.placement
    return {
        name: GuardedProvider(
            provider,
            CircuitBreaker(
                threshold=settings.breaker_threshold,
                cooldown_seconds=settings.breaker_cooldown_seconds,
            ),
            observe=metrics.observe_call,
            fence=fence,
        )
        for name, provider in providers.items()
    }


def health_of(providers: Mapping[str, GuardedProvider]) -> dict[str, ProviderHealth]:
    """What placement needs to know of each provider's breaker, read now."""
    return {
        name: ProviderHealth(
            callable=provider.breaker.allows_calls(),
            recent_failures=provider.breaker.recent_failures(),
        )
        for name, provider in providers.items()
    }
