"""Addresses for pods and Services: loopback addresses, one per pod.

Every 127.x.y.z is a loopback address on Linux and bindable without setup,
so each pod gets its own address, as if it had its own network namespace,
and every pod can listen on the same container port. Each cluster draws its
own random 127.x.y.0/24, so that two test runs on one machine (a developer's
and CI's) never hand out the same address.
"""

from __future__ import annotations

import random
import socket


def bindable(address: str, port: int) -> bool:
    """Whether a TCP listener could bind address:port right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def free_port(address: str = "127.0.0.1") -> int:
    """A port the kernel says is free on `address`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


class AddressPool:
    """Hands out 127.x.y.2, 127.x.y.3 ... of one random /24, skipping busy ones."""

    def __init__(self, rng: random.Random | None = None) -> None:
        rng = rng or random.Random()
        # Not 127.0.0.0/16: 127.0.0.1 is everyone's, and others use its neighbours.
        self.prefix = f"127.{rng.randint(10, 250)}.{rng.randint(1, 254)}"
        self._next = 2
        self._taken: set[str] = set()

    def allocate(self, port: int | None = None) -> str:
        """The next address not handed out yet (on which `port`, if given, can be bound)."""
        while self._next < 255:
            address = f"{self.prefix}.{self._next}"
            self._next += 1
            if address not in self._taken and (port is None or bindable(address, port)):
                self._taken.add(address)
                return address
        raise RuntimeError(f"no free address left in {self.prefix}.0/24")
