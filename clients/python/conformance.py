"""The conformance runner of the Python client (clients/conformance/
README.md): carries out the scenario files named on the command line with
leased.AsyncLeased, the client whose waits a caller can cancel, and prints
one line per scenario.

    python3 conformance.py SCENARIO.json...
    python3 conformance.py --steps JSON      (a helper process)
"""

import asyncio
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import leased  # noqa: E402

TMP = os.environ.get("LEASED_CONF_TMP", ".")


class StepFailed(Exception):
    pass


def control(step):
    """An env step, sent to the harness; its JSON answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.environ["LEASED_CONTROL"])
        s.sendall(json.dumps(step, separators=(",", ":")).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def append_line(name):
    if name:
        with open(os.path.join(TMP, name), "a") as f:
            f.write("x\n")


def error_code(e):
    """The README's code for an exception of the client."""
    if isinstance(e, leased.LeasedError):
        return e.code
    if isinstance(e, (ConnectionRefusedError, FileNotFoundError)):
        return "connect"
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(e, (ConnectionError, OSError, EOFError)):
        return "io"
    return "unexpected %r" % e


class Handle:
    """A held lock or grant: its guard (the async context manager) and
    what it gave."""

    def __init__(self, guard, held):
        self.guard = guard
        self.held = held


def warm_result(reply):
    """stored, failed (entries with their own error) and the first one's
    code."""
    errs = [r["error"]["code"] for r in reply["results"] if not r["ok"]]
    out = {"stored": reply["stored"], "failed": len(errs)}
    if errs:
        out["first_error"] = errs[0]
    return out


class Runner:
    def __init__(self):
        self.clients = {}
        self.handles = {}
        self.tasks = {}     # background steps: name -> (task, guard, t0)
        self.saved = {}

    async def reset(self):
        for t, _, _ in self.tasks.values():
            t.cancel()
        for ld in self.clients.values():
            await ld.close()
        self.clients, self.handles, self.tasks, self.saved = {}, {}, {}, {}

    # --- clients ---------------------------------------------------------

    async def open(self, step):
        target = step.get("target", "socket")
        kw = {"client": "conformance-py"}
        if target == "tcp":
            path = os.environ["LEASED_TCP"]
            if step.get("auth"):
                kw["auth"] = os.environ["LEASED_AUTH_TOKEN"]
        elif target == "dead":
            path = os.environ["LEASED_DEAD_SOCKET"]
        else:
            path = os.environ["LEASED_SOCKET"]
        ld = await leased.AsyncLeased.connect(path, **kw)
        self.clients[step["as"]] = ld
        return {}

    def guard(self, ld, step):
        """The guard a lock or sem step takes, not yet entered."""
        if step["do"] == "sem":
            return ld.semaphore(step["key"], step["limit"],
                                step.get("permits", 1),
                                wait_ms=step.get("wait_ms", 0))
        key = step.get("keys") or step["key"]
        kw = {"wait_ms": step.get("wait_ms", 0), "owner": step.get("owner")}
        if step.get("ttl_ms"):
            kw["ttl_ms"] = step["ttl_ms"]
        mode = step.get("mode")
        if mode == "read":
            return ld.rwlock(key).read_lock(**kw)
        if mode == "write":
            return ld.rwlock(key).write_lock(**kw)
        return ld.lock(key, **kw)

    def held_result(self, name, guard, held):
        if name:
            self.handles[name] = Handle(guard, held)
        r = {"acquired": True, "token": held.token}
        if "count" in held:
            r["count"] = held["count"]
        if "fence" in held:
            r["fence"] = held["fence"]
        return r

    async def take(self, ld, step):
        if step.get("background"):
            g = self.guard(ld, step)
            task = asyncio.ensure_future(g.__aenter__())
            self.tasks[step["as"]] = (task, g, time.monotonic())
            return {}
        g = self.guard(ld, step)
        try:
            held = await g.__aenter__()
        except (leased.LockNotAcquired, leased.NoPermit):
            return {"acquired": False}
        return self.held_result(step.get("as"), g, held)

    async def await_(self, step):
        name = step["op"]
        task, g, t0 = self.tasks.pop(name)
        try:
            r = self.held_result(name, g, await task)
        except (leased.LockNotAcquired, asyncio.CancelledError):
            r = {"acquired": False}
        r["elapsed_ms"] = int((time.monotonic() - t0) * 1000)
        return r

    async def wait_lost(self, step):
        held = self.handles[step["held"]].held
        try:
            await asyncio.wait_for(held.lost.wait(),
                                   step["within_ms"] / 1000.0)
        except asyncio.TimeoutError:
            raise StepFailed("not lost within %d ms" % step["within_ms"])
        return {"reason": (held.lost_event or {}).get("reason")}

    async def wait_risk(self, step, at_risk):
        # held.at_risk is set on lock_at_risk and cleared on lock_safe; an
        # asyncio.Event has no wait for clear, so safe is polled.
        held = self.handles[step["held"]].held
        deadline = time.monotonic() + step["within_ms"] / 1000.0
        while held.at_risk.is_set() != at_risk and not held.lost.is_set():
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.02)
        if held.at_risk.is_set() != at_risk or held.lost.is_set():
            raise StepFailed("not %s within %d ms" % (
                "at risk" if at_risk else "safe", step["within_ms"]))
        return {}

    async def cached(self, ld, step):
        spec = step["loader"]

        async def loader():
            append_line(spec.get("count_file"))
            if spec.get("mark"):
                await asyncio.to_thread(control, {
                    "do": "env", "action": "mark", "name": spec["mark"]})
            await asyncio.sleep(spec.get("delay_ms", 0) / 1000.0)
            return spec["value"]

        return {"value": await ld.cached(step["key"], loader)}

    async def update(self, ld, step):
        await ld.update(step["keys"], lambda: append_line(
            step["writer"].get("count_file")))
        return {}

    async def client_step(self, d, step):
        ld = self.clients[step["client"]]
        if d in ("lock", "sem"):
            return await self.take(ld, step)
        if d == "cached":
            return await self.cached(ld, step)
        if d == "invalidate":
            await ld.invalidate(step["keys"])
            return {}
        if d == "update":
            return await self.update(ld, step)
        if d == "rate":
            r = await ld.rate_acquire(step["key"], step["rate"],
                                      step["per_ms"], burst=step.get("burst"),
                                      permits=step.get("permits", 1),
                                      wait_ms=step.get("wait_ms", 0))
            return {"acquired": r["acquired"],
                    "retry_after_ms": r["retry_after_ms"]}
        if d == "warm":
            return warm_result(await ld.warm(
                [(e["key"], e["value"], e["ttl_ms"]) if "ttl_ms" in e
                 else (e["key"], e["value"]) for e in step["entries"]]))
        if d == "unlock_id":
            r = await ld.unlock(step["key"], owner=step["owner"],
                                request_id=step["request_id"])
            return {"released": r["released"], "count": r.get("count", 0)}
        if d == "reconnect":
            # AsyncLeased makes a new connection on its own.
            return {}
        if d == "close":
            await ld.close()
            return {}
        raise StepFailed("unknown step")

    async def step(self, step):
        d = step.get("do")
        if d == "env":
            r = await asyncio.to_thread(control, step)
            if not r.get("ok"):
                return {"error": r.get("error")}
            return r
        if d == "open":
            return await self.open(step)
        if d == "count":
            try:
                with open(os.path.join(TMP, step["file"])) as f:
                    return {"lines": len(f.readlines())}
            except FileNotFoundError:
                return {"lines": 0}
        if d == "pause":
            await asyncio.sleep(60)     # a holder that waits to be killed
            return {}
        if d == "unlock":
            h = self.handles.pop(step["held"])
            await h.guard.__aexit__(None, None, None)
            return {}
        if d == "wait_lost":
            return await self.wait_lost(step)
        if d in ("wait_at_risk", "wait_safe"):
            return await self.wait_risk(step, d == "wait_at_risk")
        if d == "await":
            return await self.await_(step)
        if d == "cancel":
            self.tasks[step["op"]][0].cancel()
            return {}
        return await self.client_step(d, step)

    # --- expectations ----------------------------------------------------

    def resolve(self, v):
        if isinstance(v, str) and v.startswith("$") and "." in v:
            name, field = v[1:].split(".", 1)
            return self.saved.get(name, {}).get(field)
        return v

    def matches(self, got, want):
        if not isinstance(want, dict):
            return got == self.resolve(want)
        for op, x in want.items():
            v = self.resolve(x)
            if got is None or v is None:
                return False
            ok = {"ne": lambda: got != v, "gt": lambda: got > v,
                  "ge": lambda: got >= v, "lt": lambda: got < v,
                  "le": lambda: got <= v}[op]()
            if not ok:
                return False
        return True

    async def run_steps(self, steps):
        for i, step in enumerate(steps, 1):
            t0 = time.monotonic()
            try:
                res = await self.step(step)
            except StepFailed as e:
                res = {"error": str(e)}
            except Exception as e:  # noqa: BLE001 - the client's errors
                res = {"error": error_code(e)}
            res.setdefault("elapsed_ms",
                           int((time.monotonic() - t0) * 1000))
            want = step.get("expect", {})
            if "error" in res and "error" not in want:
                raise StepFailed("step %d (%s): error %s"
                                 % (i, step["do"], res["error"]))
            for k, w in want.items():
                if not self.matches(res.get(k), w):
                    raise StepFailed("step %d (%s): expected %s %s, got %s"
                                     % (i, step["do"], k, json.dumps(w),
                                        json.dumps(res)))
            if "as" in step:
                self.saved[step["as"]] = res


async def run_file(path):
    with open(path) as f:
        sc = json.load(f)
    name = sc["name"]
    r = Runner()
    try:
        begin = await asyncio.to_thread(control, {
            "do": "env", "action": "begin", "scenario": name})
        if not begin.get("ok"):
            raise StepFailed("begin: %s" % begin.get("error"))
        await r.run_steps(sc["steps"])
        return name, None
    except StepFailed as e:
        return name, str(e)
    finally:
        await r.reset()


async def main(argv):
    if len(argv) == 3 and argv[1] == "--steps":
        r = Runner()
        try:
            await r.run_steps(json.loads(argv[2]))
        except StepFailed as e:
            print("helper: %s" % e, file=sys.stderr)
            return 1
        finally:
            await r.reset()
        return 0
    passed = failed = 0
    for path in argv[1:]:
        name, why = await run_file(path)
        if why is None:
            print("ok %s" % name, flush=True)
            passed += 1
        else:
            print("not ok %s: %s" % (name, why), flush=True)
            failed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv)))
