// The waiting room's proof-of-work solver, run in a Web Worker so the page stays responsive. It solves an
// ALTCHA (v2) challenge as the gateway issues it: algorithm SHA-256, cost 1, so the key of counter n is
// SHA-256(salt || nonce || n as 4 bytes, big-endian), and the answer is the first n whose key starts with the
// challenge's key prefix. Digests come from WebCrypto, many in flight at once.
//
// In:  { challenge, difficulty }  the 428 answer's fields (difficulty: the most counters it can take)
// Out: { progress }               counters tried so far, now and then
//      { payload }                base64 of {"challenge", "solution": {"counter", "derivedKey", "time"}}: what
//                                 the join sends in its `altcha` field
//      { error }                  a challenge this solver cannot take
'use strict';

const BATCH = 256;

const bytes = (hex) => Uint8Array.from(hex.match(/../g) || [], (h) => parseInt(h, 16));
const hex = (buf) => Array.from(buf, (b) => b.toString(16).padStart(2, '0')).join('');

self.onmessage = async ({ data }) => {
  const { challenge, difficulty } = data;
  const p = challenge.parameters;
  if (p.algorithm !== 'SHA-256' || p.cost !== 1 || p.keyPrefix.length % 2) {
    self.postMessage({ error: `unsupported challenge: ${p.algorithm}, cost ${p.cost}` });
    return;
  }
  const salt = bytes(p.salt);
  const nonce = bytes(p.nonce);
  const prefix = bytes(p.keyPrefix);
  const at = salt.length + nonce.length;
  const started = performance.now();
  const limit = 2 ** 32;
  for (let base = 0; base < limit; base += BATCH) {
    const tries = [];
    for (let n = base; n < base + BATCH; n += 1) {
      const input = new Uint8Array(at + 4);
      input.set(salt);
      input.set(nonce, salt.length);
      new DataView(input.buffer).setUint32(at, n);
      tries.push(crypto.subtle.digest('SHA-256', input));
    }
    const keys = await Promise.all(tries);
    for (let i = 0; i < keys.length; i += 1) {
      const key = new Uint8Array(keys[i]);
      if (prefix.every((b, j) => key[j] === b)) {
        const solution = { counter: base + i, derivedKey: hex(key.subarray(0, p.keyLength)), time: performance.now() - started };
        self.postMessage({ payload: btoa(JSON.stringify({ challenge, solution })) });
        return;
      }
    }
    if (base % (BATCH * 16) === 0) self.postMessage({ progress: base + BATCH, difficulty });
  }
  self.postMessage({ error: 'no counter solves this challenge' });
};
