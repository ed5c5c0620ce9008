"""What a message needs (worker slots, memory, CPUs, GPUs) against what its queue has free.

A message takes ``slots`` of its queue's ``num_workers`` (default 1) and,
when the queue has a ``budget``, its ``needs``: memory and CPUs counted
against the budget's sums, GPUs handed out by id (the budget's list).  A
message starts only when all of it fits beside the running ones; one that
cannot fit even on an idle queue is refused at create (:func:`check_create`)
— or, after a reload shrank the queue, held and said in the log, never
reserved for (``rqsys.daemon.scheduler``).  Counts are in memory: after a
restart nothing runs.

Memory and CPUs are also enforced: they become the run's ``memory_max`` and
``cpu_quota`` (:func:`as_limits`), held by its sub-cgroup or scope, or by
RLIMIT_AS in embedded mode (``rqsys.run.limits``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from rqsys.errors import BadRequest
from rqsys.run.resources import size_bytes

Msg = dict[str, Any]


class Need(NamedTuple):
    """What one run holds while it runs (a tuple: hashed and compared in C,
    the schedule's wait keys)."""

    slots: int = 1
    memory: int = 0  # bytes
    cpus: float = 0.0
    gpus: int = 0


ONE = Need()


def need_of(msg: Msg) -> Need:
    """``msg``'s need (most messages: one slot and nothing else)."""
    if "slots" not in msg and "needs" not in msg:
        return ONE
    needs = msg.get("needs") or {}
    return Need(int(msg.get("slots") or 1),
                size_bytes(needs["memory"]) if "memory" in needs else 0,
                float(needs.get("cpus") or 0), int(needs.get("gpus") or 0))


def as_limits(msg: Msg) -> dict[str, Any]:
    """The run limits its needs set: ``memory_max`` and ``cpu_quota``."""
    needs = msg.get("needs") or {}
    limits: dict[str, Any] = {}
    if "memory" in needs:
        limits["memory_max"] = needs["memory"]
    if "cpus" in needs:
        limits["cpu_quota"] = f"{math.ceil(float(needs['cpus']) * 100)}%"
    return limits


def check_create(msg: Msg, config: dict[str, Any]) -> None:
    """Refuse (400, naming the field) a message that could never start on
    this queue, however idle."""
    slots = int(msg.get("slots") or 1)
    if slots > config["num_workers"]:
        raise BadRequest(f"slots: {slots} is more than the queue's num_workers "
                         f"({config['num_workers']})")
    budget = config.get("budget") or {}
    for key, wanted in (msg.get("needs") or {}).items():
        if key not in budget:
            raise BadRequest(f"needs.{key}: the queue has no {key} in its budget")
        have = len(budget[key]) if key == "gpus" else budget[key]
        if _amount(key, wanted) > _amount(key, have):
            raise BadRequest(f"needs.{key}: {wanted} is more than the queue's budget ({have})")


def _amount(key: str, value: Any) -> float:
    return size_bytes(value) if key == "memory" else float(value)


class Room:
    """The queue's slots and budget, and what the running messages hold of them."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.held: dict[str, tuple[Need, list[str]]] = {}  # running id -> its need, GPU ids
        self.slots = self.memory = 0
        self.cpus = 0.0
        self._outside = 0  # slots of ended runs still being stopped (their scopes)
        self.grown = 0  # counts the times more came free (what did not fit may now)
        self.configure(config)

    @property
    def outside(self) -> int:
        return self._outside

    @outside.setter
    def outside(self, slots: int) -> None:
        if slots < self._outside:
            self.grown += 1
        self._outside = slots

    def configure(self, config: dict[str, Any]) -> None:
        """The queue's totals (at start and at each reload); what runs keeps its
        share.  A resource the budget no longer names is not counted."""
        budget = config.get("budget") or {}
        self.budget = dict(budget)
        self.total_slots = int(config["num_workers"])
        self.total_memory = size_bytes(budget["memory"]) if "memory" in budget else math.inf
        self.total_cpus = float(budget["cpus"]) if "cpus" in budget else math.inf
        self.gpu_ids = list(budget.get("gpus") or ())
        taken = {gpu for _need, gpus in self.held.values() for gpu in gpus}
        self.free_gpus = [gpu for gpu in self.gpu_ids if gpu not in taken]
        self.grown += 1

    def fits(self, need: Need) -> bool:
        """Whether ``need`` fits beside what runs now."""
        if self.slots + self.outside + need.slots > self.total_slots:
            return False
        return need is ONE or (
            self.memory + need.memory <= self.total_memory
            and self.cpus + need.cpus <= self.total_cpus + 1e-9
            and (need.gpus <= len(self.free_gpus) or not self.gpu_ids))

    def free(self) -> tuple[float, float, float, float]:
        """What is free now, as a Need's fields (for many needs checked at once)."""
        return (self.total_slots - self.slots - self.outside, self.total_memory - self.memory,
                self.total_cpus - self.cpus + 1e-9,
                len(self.free_gpus) if self.gpu_ids else math.inf)

    def ever_fits(self, need: Need) -> bool:
        """Whether ``need`` fits the idle queue (a reload may have shrunk it)."""
        return (need.slots <= self.total_slots and need.memory <= self.total_memory
                and need.cpus <= self.total_cpus + 1e-9
                and (need.gpus <= len(self.gpu_ids) or not self.gpu_ids))

    def has_free_slot(self) -> bool:
        return self.slots + self.outside < self.total_slots

    def take(self, msg_id: str, need: Need) -> list[str]:
        """``msg_id`` starts: its share is held; the GPU ids it gets."""
        gpus, self.free_gpus = self.free_gpus[:need.gpus], self.free_gpus[need.gpus:]
        self.held[msg_id] = (need, gpus)
        self.slots += need.slots
        self.memory += need.memory
        self.cpus += need.cpus
        return gpus

    def give(self, msg_id: str) -> None:
        """``msg_id`` no longer runs: its share is free."""
        held = self.held.pop(msg_id, None)
        if held is None:
            return
        need, gpus = held
        self.grown += 1
        self.slots -= need.slots
        self.memory -= need.memory
        self.cpus -= need.cpus
        self.free_gpus += [gpu for gpu in gpus if gpu in self.gpu_ids]

    def gpus_of(self, msg_id: str) -> list[str]:
        held = self.held.get(msg_id)
        return held[1] if held else []

    def usage(self) -> dict[str, Any]:
        """Used and total of each (for stats and the queue page)."""
        used: dict[str, Any] = {"slots": {"used": self.slots, "total": self.total_slots}}
        if "memory" in self.budget:
            used["memory"] = {"used": self.memory, "total": self.total_memory}
        if "cpus" in self.budget:
            used["cpus"] = {"used": round(self.cpus, 3), "total": self.total_cpus}
        if self.gpu_ids:
            used["gpus"] = {"used": sorted(g for _n, gs in self.held.values() for g in gs),
                            "total": list(self.gpu_ids)}
        return used

