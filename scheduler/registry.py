"""Policies by name."""

from __future__ import annotations

from scheduler.policy import FcfsPolicy, Policy, PriorityPolicy, StaticPolicy
from scheduler.slice_policy import SlicePolicy

POLICIES: dict[str, type] = {"fcfs": FcfsPolicy, "priority": PriorityPolicy,
                             "static": StaticPolicy, "slice": SlicePolicy}


def make_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    policy: Policy = POLICIES[name]()
    return policy
