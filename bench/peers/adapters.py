"""The only place the bench touches the leased Python client: a change of
its API is a change here, not in the workloads."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "clients", "python"))
import leased  # noqa: E402


def connect(sock):
    return leased.Leased(sock)


def pool(sock, size):
    """One thread-safe Pool of SIZE connections for all the workers."""
    return leased.Pool(sock, size=size)


def lock(ld, key, wait_ms=0):
    """-> {"acquired": bool, "fence": int}"""
    return ld.try_lock(key, wait_ms=wait_ms)


def unlock(ld, key, token=None):
    """By TOKEN when given: a Pool's next call may take another
    connection than the lock's."""
    return ld.unlock(key, token=token)


def cached(ld, key, loader):
    return ld.cached(key, loader)


def close(ld):
    ld.close()
