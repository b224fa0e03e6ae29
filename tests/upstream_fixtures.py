"""Pytest fixtures that start fake upstreams on loopback and stop them at teardown."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devkit.upstream import FakeUpstream

MakeFake = Callable[..., FakeUpstream]


@pytest.fixture
def fake_upstream_factory() -> Iterator[MakeFake]:
    """`make(name="a", models=("gpt-5",), **kw)` starts a FakeUpstream; all are stopped after the test."""
    started: list[FakeUpstream] = []

    def make(name: str = "a", models: tuple[str, ...] = ("gpt-5",), **kw: Any) -> FakeUpstream:
        fake = FakeUpstream(name, models, **kw).start()
        started.append(fake)
        return fake

    yield make
    for fake in started:
        fake.stop()


@pytest.fixture
def fake_upstream(fake_upstream_factory: MakeFake) -> FakeUpstream:
    """One started fake named "a" serving gpt-5."""
    return fake_upstream_factory()
