// The reference server (@durable-streams/server) started as spec durable-streams.md §2.3 says, for bench/streams.py.
import { DurableStreamTestServer } from "@durable-streams/server"
const server = new DurableStreamTestServer({
  port: Number(process.env.DS_PORT ?? 4437), host: "127.0.0.1",
  dataDir: process.env.DS_DATA_DIR || undefined,
  longPollTimeout: Number(process.env.DS_LONGPOLL_MS ?? 30000),
  compression: process.env.DS_COMPRESSION !== "0",
})
const url = await server.start()
console.log(`ref server listening at ${url} (pid ${process.pid})`)
const stop = async () => { await server.stop(); process.exit(0) }
process.on("SIGTERM", stop); process.on("SIGINT", stop)
