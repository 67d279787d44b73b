// The load side of bench/streams.py, in Node so both servers meet the same client (plain fetch, no
// client batching): node streams_load.mjs BASE_URL prints one JSON object of figures.
const base = process.argv[2]
const WRITERS = 16, APPENDS = 4000, LOG_EVENTS = 10000, CATCHUP_REPEATS = 10
const READERS = 50, FANOUT_EVENTS = 200, FANOUT_GAP_MS = 2, LONGPOLL_ROUNDS = 200
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const now = () => performance.now()
const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] }
let n = 0
const name = (what) => `${base}/v1/stream/bench-${what}-${process.pid}-${n++}`

async function create(url, type, body) {
  const r = await fetch(url, { method: "PUT", headers: { "content-type": type }, body })
  if (r.status !== 201) throw new Error(`PUT ${url}: ${r.status}`)
  return r.headers.get("stream-next-offset")
}

async function appends(type, bodyOf) {
  const url = name("append")
  await create(url, type)
  let next = 0
  const lat = []
  const writer = async () => {
    while (next < APPENDS) {
      const i = next++
      const t = now()
      const r = await fetch(url, { method: "POST", headers: { "content-type": type }, body: bodyOf(i) })
      await r.arrayBuffer()
      if (r.status !== 204 && r.status !== 200) throw new Error(`POST: ${r.status}`)
      lat.push(now() - t)
    }
  }
  const t0 = now()
  await Promise.all(Array.from({ length: WRITERS }, writer))
  const seconds = (now() - t0) / 1000
  return { perSecond: APPENDS / seconds, p50: pct(lat, 50), p99: pct(lat, 99) }
}

const event = (i) => JSON.stringify({ type: "TEXT_MESSAGE_CONTENT", messageId: "m-1", delta: `delta number ${i} `.padEnd(40, "x") })

async function catchUp() {
  const url = name("catchup")
  await create(url, "application/json")
  for (let i = 0; i < LOG_EVENTS; i += 500) {
    const batch = "[" + Array.from({ length: 500 }, (_, j) => event(i + j)).join(",") + "]"
    const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: batch })
    await r.arrayBuffer()
  }
  const times = []
  for (let k = 0; k < CATCHUP_REPEATS; k++) {
    const t = now()
    let offset = "-1", count = 0
    for (;;) {
      const r = await fetch(`${url}?offset=${offset}`)
      const items = await r.json()
      count += items.length
      offset = r.headers.get("stream-next-offset")
      if (r.headers.get("stream-up-to-date") === "true") break
    }
    times.push(now() - t)
    if (count !== LOG_EVENTS) throw new Error(`catch-up read ${count} events, not ${LOG_EVENTS}`)
  }
  return { p50: pct(times, 50), min: Math.min(...times) }
}

async function fanOut() {
  const url = name("fanout")
  await create(url, "application/json")
  const sent = new Map()
  const lat = []
  let delivered = 0
  const controller = new AbortController()
  const reader = async (ready) => {
    const r = await fetch(`${url}?offset=now&live=sse`, { signal: controller.signal })
    const body = r.body.getReader()
    const decoder = new TextDecoder()
    let buffer = "", got = 0
    ready()
    try {
      while (got < FANOUT_EVENTS) {
        const { value, done } = await body.read()
        if (done) break
        buffer += decoder.decode(value, { stream: true })
        let cut
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, cut)
          buffer = buffer.slice(cut + 2)
          if (!frame.startsWith("event: data")) continue
          const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5)).join("\n")
          const t = now()
          for (const item of JSON.parse(data)) {
            lat.push(t - sent.get(item.i))
            got++
            delivered++
          }
        }
      }
    } catch (e) {
      if (e.name !== "AbortError") throw e
    }
  }
  const readies = []
  const readers = Array.from({ length: READERS }, () => reader((f) => f).catch((e) => e))
  // Give the readers time to connect and reach the tail before the first event.
  await sleep(500)
  for (let i = 0; i < FANOUT_EVENTS; i++) {
    sent.set(i, now())
    const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ i }) })
    await r.arrayBuffer()
    await sleep(FANOUT_GAP_MS)
  }
  const deadline = now() + 10000
  while (delivered < READERS * FANOUT_EVENTS && now() < deadline) await sleep(10)
  controller.abort()
  await Promise.all(readers)
  return { p50: pct(lat, 50), p99: pct(lat, 99), delivered, expected: READERS * FANOUT_EVENTS }
}

async function longPoll() {
  const url = name("longpoll")
  let offset = await create(url, "application/octet-stream")
  const body = "x".repeat(100)
  const rtts = []
  for (let i = 0; i < LONGPOLL_ROUNDS; i++) {
    const poll = fetch(`${url}?offset=${offset}&live=long-poll`)
    await sleep(1)
    const t = now()
    const w = await fetch(url, { method: "POST", headers: { "content-type": "application/octet-stream" }, body })
    await w.arrayBuffer()
    const r = await poll
    await r.arrayBuffer()
    rtts.push(now() - t)
    offset = r.headers.get("stream-next-offset")
  }
  return { p50: pct(rtts, 50), p99: pct(rtts, 99) }
}

// Warm both sides up (connection pool, JIT, the server's first-use paths) before anything is timed.
{
  const url = name("warmup")
  await create(url, "application/octet-stream")
  await Promise.all(Array.from({ length: WRITERS }, async () => {
    for (let i = 0; i < 25; i++) await (await fetch(url, { method: "POST", headers: { "content-type": "application/octet-stream" }, body: "w" })).arrayBuffer()
  }))
}

const result = {
  octetAppends: await appends("application/octet-stream", () => "x".repeat(100)),
  jsonAppends: await appends("application/json", event),
  catchUp: await catchUp(),
  fanOut: await fanOut(),
  longPoll: await longPoll(),
}
process.stdout.write(JSON.stringify(result) + "\n")
