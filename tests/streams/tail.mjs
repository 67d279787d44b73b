// Tail a Durable Streams JSON stream with the official TypeScript client (@durable-streams/client):
// node tail.mjs URL OFFSET LIVE prints one JSON line per message until the stream is closed.
import { stream } from "@durable-streams/client"

const [url, offset, live] = process.argv.slice(2)
const response = await stream({ url, offset, live: live === "true" ? true : live, warnOnHttp: false })
for await (const message of response.jsonStream()) process.stdout.write(JSON.stringify(message) + "\n")
