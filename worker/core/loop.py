"""What each of a replica's loops is built from: the settings, its store and broker (as the ports
it needs of them), the wake-up and the database clock. worker/service.py wires the same ones into
the firing loop and intake."""

from __future__ import annotations

from typing import Generic, TypeVar

from worker.config import Settings
from worker.core.clock import Clock
from worker.core.wakeup import Wakeup

StoreT = TypeVar("StoreT")
BrokerT = TypeVar("BrokerT")


class Loop(Generic[StoreT, BrokerT]):
    def __init__(
        self, settings: Settings, store: StoreT, broker: BrokerT, wakeup: Wakeup, clock: Clock
    ) -> None:
        self.s = settings
        self.store = store
        self.broker = broker
        self.wakeup = wakeup
        self.clock = clock  # the database clock: an occurrence is published once due on it
