"""Hypothesis settings shared by the fuzz tests at the HTTP and websocket edges."""

from hypothesis import HealthCheck, Phase, settings


def fuzz_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        # No shrinking: each step talks to the live server, and a minimal example is not worth a
        # minute; the failure message shows the example as generated.
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        derandomize=True,  # the same examples on every run: a failure here is reproducible, not flaky
    )
