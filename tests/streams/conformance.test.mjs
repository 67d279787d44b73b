// The official Durable Streams server conformance suite against CONFORMANCE_TEST_URL (spec §2.2):
// its own CLI finds no test files when installed from npm, so this file hands vitest the suite.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) throw new Error("set CONFORMANCE_TEST_URL to the server under test")
runConformanceTests({ baseUrl, longPollTimeoutMs: Number(process.env.CONFORMANCE_LONGPOLL_MS ?? 20000) })
