import { defineConfig } from "vitest/config"

// The suite's cases carry vitest's default 5 s bound; beside two other pytest workers on two cores, a
// property-based case (hundreds of appends and reads) or the chunk-size pagination case ran past it.
// These are hang bounds, not speed limits: speed is measured in bench/streams.py.
export default defineConfig({ test: { include: ["conformance.test.mjs"], testTimeout: 60_000, hookTimeout: 60_000 } })
