'use strict';
// The conformance runner of the Node.js client (clients/conformance/
// README.md): carries out the scenario files named on the command line
// with leased.js and prints one line per scenario. Locks and grants are
// held the way the client's README shows it, inside using() and
// withSemaphore(), whose signal is the lost signal. The client has no
// update(): the runner runs the writer, then invalidate(), as its README
// tells applications to.
//
//   node conformance.js SCENARIO.json...
//   node conformance.js --steps JSON      (a helper process)

const fs = require('fs');
const net = require('net');
const path = require('path');
const { Leased, LeasedError } = require('./leased');

const TMP = process.env.LEASED_CONF_TMP || '.';

class StepFailed extends Error {}

// An env step, sent to the harness; its JSON answer.
function control(step) {
  return new Promise((resolve, reject) => {
    const s = net.createConnection(process.env.LEASED_CONTROL);
    let data = '';
    s.setEncoding('utf8');
    s.on('connect', () => s.write(JSON.stringify(step) + '\n'));
    s.on('data', (d) => { data += d; });
    s.on('end', () => {
      try {
        resolve(JSON.parse(data));
      } catch (e) {
        reject(e);
      }
    });
    s.on('error', reject);
  });
}

function appendLine(name) {
  if (name) fs.appendFileSync(path.join(TMP, name), 'x\n');
}

// stored, failed (entries with their own error) and the first one's code.
function warmResult(reply) {
  const errs = reply.results.filter((r) => !r.ok).map((r) => r.error.code);
  const out = { stored: reply.stored, failed: errs.length };
  if (errs.length) out.first_error = errs[0];
  return out;
}

const delay = (ms) => new Promise((r) => setTimeout(r, ms));

// The README's code for an error of the client.
function errorCode(e) {
  if (e instanceof LeasedError) return e.code;
  if (e.code === 'ECONNREFUSED' || e.code === 'ENOENT') return 'connect';
  if (e.code === 'not_acquired' || e.code === 'no_permit') return null;
  if (e instanceof StepFailed) return e.message;
  return 'io';
}

class Runner {
  constructor() {
    this.clients = new Map();
    this.handles = new Map(); // name -> {release, done, signal}
    this.saved = new Map();
  }

  reset() {
    for (const h of this.handles.values()) {
      if (h.release) h.release();
      if (h.abort) h.abort.abort();
    }
    for (const ld of this.clients.values()) ld.close();
    this.clients.clear();
    this.handles.clear();
    this.saved.clear();
  }

  async open(step) {
    const target = step.target || 'socket';
    const opts = { client: 'conformance-node' };
    let where = process.env.LEASED_SOCKET;
    if (target === 'tcp') {
      where = process.env.LEASED_TCP;
      if (step.auth) opts.auth = process.env.LEASED_AUTH_TOKEN;
    } else if (target === 'dead') {
      where = process.env.LEASED_DEAD_SOCKET;
    }
    // A Pool (of one connection) reconnects after a daemon restart; a
    // single Leased stays closed by design (leased-protocol(7) CLIENTS).
    const ld = await Leased.connect(where, { ...opts, connections: 1 });
    // Events with no listener would be thrown by the EventEmitter.
    ld.on('error', () => {});
    this.clients.set(step.as, ld);
    return {};
  }

  // Start holding what a lock or sem step asks for; resolves with the
  // handle once granted ({acquired:false} when not). The hold lasts
  // until the handle's release() is called.
  hold(ld, step, abort) {
    let granted, failed, release;
    const got = new Promise((res, rej) => { granted = res; failed = rej; });
    const until = new Promise((r) => { release = r; });
    const body = async (signal, held) => {
      granted({ signal, held });
      await until;
    };
    let done;
    if (step.do === 'sem') {
      const opts = { permits: step.permits, wait_ms: step.wait_ms };
      done = ld.withSemaphore(step.key, step.limit, opts,
        (grant, signal) => body(signal, grant));
    } else {
      const key = step.keys || step.key;
      const opts = { wait_ms: step.wait_ms, ttl_ms: step.ttl_ms,
        owner: step.owner, mode: step.mode };
      if (abort) opts.signal = abort.signal;
      done = ld.using(key, opts, body);
    }
    done.catch(failed);
    return got.then(({ signal, held }) => {
      const h = { release, done, signal, held, abort };
      const r = { acquired: true, token: held.token };
      if (held.count !== undefined) r.count = held.count;
      if (held.fence !== undefined) r.fence = held.fence;
      return { h, r };
    }, (e) => {
      if (e.code === 'not_acquired' || e.code === 'no_permit' ||
          (abort && abort.signal.aborted)) {
        return { h: null, r: { acquired: false } };
      }
      throw e;
    });
  }

  async take(ld, step) {
    if (step.background) {
      const abort = new AbortController();
      const t0 = Date.now();
      const pending = this.hold(ld, step, abort);
      pending.catch(() => {});
      this.handles.set(step.as, { abort, pending, t0 });
      return {};
    }
    const { h, r } = await this.hold(ld, step, null);
    if (h && step.as) this.handles.set(step.as, h);
    return r;
  }

  async await(step) {
    const bg = this.handles.get(step.op);
    const { h, r } = await bg.pending;
    if (h) this.handles.set(step.op, h);
    else this.handles.delete(step.op);
    r.elapsed_ms = Date.now() - bg.t0;
    return r;
  }

  async unlock(step) {
    const h = this.handles.get(step.held);
    this.handles.delete(step.held);
    h.release();
    await h.done;
    return {};
  }

  async waitLost(step) {
    const { signal } = this.handles.get(step.held);
    if (!signal.aborted) {
      await new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new StepFailed(
          `not lost within ${step.within_ms} ms`)), step.within_ms);
        signal.addEventListener('abort', () => {
          clearTimeout(t);
          resolve();
        }, { once: true });
      });
    }
    const why = signal.reason || {};
    return { reason: why.event ? why.event.reason : why.code };
  }

  // held.atRisk, waited for through held.risk's 'at_risk' or 'safe'.
  async waitRisk(step, atRisk) {
    const { signal, held } = this.handles.get(step.held);
    if (held.atRisk !== atRisk && !signal.aborted) {
      await new Promise((resolve) => {
        const done = () => {
          clearTimeout(t);
          held.risk.off(atRisk ? 'at_risk' : 'safe', done);
          signal.removeEventListener('abort', done);
          resolve();
        };
        const t = setTimeout(done, step.within_ms);
        held.risk.on(atRisk ? 'at_risk' : 'safe', done);
        signal.addEventListener('abort', done);
      });
    }
    if (held.atRisk !== atRisk || signal.aborted) {
      throw new StepFailed(`not ${atRisk ? 'at risk' : 'safe'} within ` +
        `${step.within_ms} ms`);
    }
    return {};
  }

  async cached(ld, step) {
    const spec = step.loader;
    const value = await ld.cached(step.key, async () => {
      appendLine(spec.count_file);
      if (spec.mark) {
        await control({ do: 'env', action: 'mark', name: spec.mark });
      }
      await delay(spec.delay_ms || 0);
      return spec.value;
    });
    return { value };
  }

  async clientStep(step) {
    const ld = this.clients.get(step.client);
    if (!ld) throw new StepFailed('no such client');
    switch (step.do) {
      case 'lock':
      case 'sem':
        return this.take(ld, step);
      case 'cached':
        return this.cached(ld, step);
      case 'invalidate':
        await ld.invalidate(step.keys);
        return {};
      case 'update':
        appendLine(step.writer.count_file);
        await ld.invalidate(step.keys);
        return {};
      case 'rate': {
        const r = await ld.rateAcquire(step.key, step.rate, step.per_ms, {
          burst: step.burst, permits: step.permits, wait_ms: step.wait_ms });
        return { acquired: r.acquired, retry_after_ms: r.retry_after_ms };
      }
      case 'warm':
        return warmResult(await ld.warm(step.entries));
      case 'unlock_id': {
        const r = await ld.unlock(step.key, { owner: step.owner,
          request_id: step.request_id });
        return { released: r.released, count: r.count || 0 };
      }
      case 'reconnect':
        // The Pool connects again by itself at its next call.
        return {};
      case 'close':
        ld.close();
        return {};
      default:
        throw new StepFailed('unknown step');
    }
  }

  async step(step) {
    switch (step.do) {
      case 'env': {
        const r = await control(step);
        return r.ok ? r : { error: r.error };
      }
      case 'open':
        return this.open(step);
      case 'count': {
        const f = path.join(TMP, step.file);
        const n = fs.existsSync(f) ?
          fs.readFileSync(f, 'utf8').split('\n').length - 1 : 0;
        return { lines: n };
      }
      case 'pause':
        await delay(60000); // a holder that waits to be killed
        return {};
      case 'unlock':
        return this.unlock(step);
      case 'wait_lost':
        return this.waitLost(step);
      case 'wait_at_risk':
      case 'wait_safe':
        return this.waitRisk(step, step.do === 'wait_at_risk');
      case 'await':
        return this.await(step);
      case 'cancel':
        this.handles.get(step.op).abort.abort();
        return {};
      default:
        return this.clientStep(step);
    }
  }

  resolve(v) {
    if (typeof v === 'string' && v.startsWith('$') && v.includes('.')) {
      const [name, field] = [v.slice(1, v.indexOf('.')),
        v.slice(v.indexOf('.') + 1)];
      return (this.saved.get(name) || {})[field];
    }
    return v;
  }

  matches(got, want) {
    if (want === null || typeof want !== 'object') {
      return got === this.resolve(want);
    }
    for (const [op, x] of Object.entries(want)) {
      const v = this.resolve(x);
      if (got === undefined || v === undefined) return false;
      const ok = { ne: got !== v, gt: got > v, ge: got >= v, lt: got < v,
        le: got <= v }[op];
      if (!ok) return false;
    }
    return true;
  }

  async runSteps(steps) {
    for (let i = 0; i < steps.length; i++) {
      const step = steps[i];
      const t0 = Date.now();
      let res;
      try {
        res = await this.step(step);
      } catch (e) {
        res = { error: errorCode(e) };
      }
      if (res.elapsed_ms === undefined) res.elapsed_ms = Date.now() - t0;
      const want = step.expect || {};
      const where = `step ${i + 1} (${step.do})`;
      if (res.error !== undefined && want.error === undefined) {
        throw new StepFailed(`${where}: error ${res.error}`);
      }
      for (const [k, w] of Object.entries(want)) {
        if (!this.matches(res[k], w)) {
          throw new StepFailed(`${where}: expected ${k} ${JSON.stringify(w)}, ` +
            `got ${JSON.stringify(res)}`);
        }
      }
      if (step.as) this.saved.set(step.as, res);
    }
  }
}

async function runFile(file) {
  const sc = JSON.parse(fs.readFileSync(file, 'utf8'));
  const r = new Runner();
  try {
    const begin = await control({ do: 'env', action: 'begin',
      scenario: sc.name });
    if (!begin.ok) throw new StepFailed(`begin: ${begin.error}`);
    await r.runSteps(sc.steps);
    return [sc.name, null];
  } catch (e) {
    return [sc.name, e.message];
  } finally {
    r.reset();
  }
}

async function main(argv) {
  if (argv.length === 2 && argv[0] === '--steps') {
    const r = new Runner();
    try {
      await r.runSteps(JSON.parse(argv[1]));
      return 0;
    } catch (e) {
      process.stderr.write(`helper: ${e.message}\n`);
      return 1;
    } finally {
      r.reset();
    }
  }
  let passed = 0;
  let failed = 0;
  for (const file of argv) {
    const [name, why] = await runFile(file);
    if (why === null) {
      process.stdout.write(`ok ${name}\n`);
      passed++;
    } else {
      process.stdout.write(`not ok ${name}: ${why}\n`);
      failed++;
    }
  }
  process.stdout.write(`${passed} passed, ${failed} failed\n`);
  return failed ? 1 : 0;
}

main(process.argv.slice(2)).then((rc) => process.exit(rc), (e) => {
  process.stderr.write(`${e.stack}\n`);
  process.exit(1);
});
