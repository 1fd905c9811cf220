"""What each of a replica's loops is built from: settings, store, broker, wake-up and database clock."""

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
