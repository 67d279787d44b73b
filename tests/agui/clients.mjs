// The official clients against a boxwright app: `node clients.mjs <scenario> '<json args>'` prints one JSON result.
//
// Scenarios (driven by tests/e2e/test_agui_clients.py):
//   httpagent  @ag-ui/client's HttpAgent posts a RunAgentInput to /agui; its own pipeline verifies every event
//              (RUN_STARTED first, content inside START/END, nothing after the terminal event) and rebuilds the
//              messages. With `resume`, its fetch splices a dropped answer onto the tail route of another process
//              (GET /runs/{id}/events with Last-Event-ID), as a client that survives a server dying does.
//   verify     each named event list of a JSON file through @ag-ui/core's event schema and @ag-ui/client's own
//              verifier (what every AG-UI agent's pipeline runs); prints {name: null | the verifier's error}.
//   tanstack   @tanstack/ai-client's ChatClient with its SSE connection adapter on /agui, then a second ChatClient
//              whose connection is ai-client's stream() adapter fed by @durable-streams/client reading the run's
//              Durable Streams URL (GET /runs/{id}/stream); both report the messages they rebuilt.
import { readFileSync } from "node:fs";
import { HttpAgent, verifyEvents } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";
import { from, lastValueFrom, toArray } from "rxjs";
import { ChatClient, fetchServerSentEvents, stream as streamAdapter } from "@tanstack/ai-client";

const [scenario, rawArgs] = process.argv.slice(2);
const args = JSON.parse(rawArgs ?? "{}");

function describe(error) {
  return { name: error?.name ?? typeof error, message: String(error?.message ?? error) };
}

// A fetch whose answer continues on `resumeBase`'s tail route when the first connection drops before the run's end.
function splicingFetch(resumeBase, runId, log) {
  return async (url, init) => {
    const first = await fetch(url, init);
    if (!first.ok) return first;
    const encoder = new TextEncoder();
    let lastId;
    let ended = false;
    const body = new ReadableStream({
      async start(controller) {
        const forward = (frame) => {
          const lines = frame.split("\n");
          if (lines.some((line) => line.startsWith("event:"))) return; // the tail's closing `event: status`
          const id = lines.find((line) => line.startsWith("id: "));
          const data = lines.find((line) => line.startsWith("data: "));
          if (id) lastId = id.slice(4);
          if (data) {
            const type = JSON.parse(data.slice(6)).type;
            if (type === "RUN_FINISHED" || type === "RUN_ERROR") ended = true;
          }
          controller.enqueue(encoder.encode(frame + "\n\n"));
        };
        const pump = async (response) => {
          const reader = response.body.getReader();
          const decoder = new TextDecoder();
          let buffer = "";
          try {
            for (;;) {
              const { done, value } = await reader.read();
              if (done) break;
              buffer += decoder.decode(value, { stream: true });
              let cut;
              while ((cut = buffer.indexOf("\n\n")) >= 0) {
                forward(buffer.slice(0, cut));
                buffer = buffer.slice(cut + 2);
              }
            }
          } catch (error) {
            log.push({ dropped: describe(error).message, lastId });
          }
        };
        await pump(first);
        for (let hop = 0; !ended && hop < 5; hop++) {
          log.push({ resumeFrom: lastId });
          const headers = { Accept: "text/event-stream", ...(lastId ? { "Last-Event-ID": lastId } : {}) };
          await pump(await fetch(`${resumeBase}/runs/${encodeURIComponent(runId)}/events`, { headers }));
        }
        controller.close();
      },
    });
    return new Response(body, { status: first.status, headers: first.headers });
  };
}

async function httpagent() {
  const events = [];
  const splices = [];
  const agent = new HttpAgent({
    url: `${args.url}/agui`,
    threadId: args.threadId,
    initialMessages: args.messages ?? [{ id: "u-1", role: "user", content: args.prompt }],
    headers: args.headers ?? {},
    ...(args.resume ? { fetch: splicingFetch(args.resume, args.runId, splices) } : {}),
  });
  let error = null;
  let result = null;
  try {
    result = await agent.runAgent(
      { runId: args.runId, tools: args.tools ?? [] },
      { onEvent: ({ event }) => void events.push(event) },
    );
  } catch (caught) {
    error = describe(caught);
  }
  return {
    error,
    events,
    messages: agent.messages,
    newMessages: result?.newMessages ?? null,
    splices,
  };
}

async function drainTanstack(client) {
  // ChatClient settles its own promise once the run's terminal event was processed.
  for (let i = 0; i < 600 && client.getIsLoading(); i++) await new Promise((r) => setTimeout(r, 50));
}

async function tanstack() {
  const began = Date.now();
  const result = {};
  if (!args.durableRunId) {
    let posted = null; // the runId the adapter put in its RunAgentInput
    const fetchClient = async (url, init) => {
      if (init?.method === "POST" && typeof init.body === "string") posted = JSON.parse(init.body).runId;
      return fetch(url, init);
    };
    const sse = new ChatClient({
      connection: fetchServerSentEvents(`${args.url}/agui`, { fetchClient }),
      threadId: args.threadId,
    });
    let sseError = null;
    try {
      await sse.sendMessage(args.prompt);
      await drainTanstack(sse);
    } catch (caught) {
      sseError = describe(caught);
    }
    result.sse = { error: sseError ?? (sse.getError() ? describe(sse.getError()) : null), messages: sse.getMessages() };
    result.runId = posted;
    sse.dispose();
  } else {
    // The durable-stream connection: TanStack's stream() adapter over the run's Durable Streams URL.
    const { stream: readStream } = await import("@durable-streams/client");
    const url = `${args.url}/runs/${encodeURIComponent(args.durableRunId)}/stream`;
    const connection = streamAdapter(async function* () {
      const response = await readStream({ url, offset: "-1", live: false });
      for (const chunk of await response.json()) yield chunk;
    });
    const durable = new ChatClient({ connection, threadId: `${args.threadId}-durable` });
    let durableError = null;
    try {
      await durable.sendMessage(args.prompt);
      await drainTanstack(durable);
    } catch (caught) {
      durableError = describe(caught);
    }
    result.durable = {
      error: durableError ?? (durable.getError() ? describe(durable.getError()) : null),
      messages: durable.getMessages(),
    };
    durable.dispose();
  }
  result.timings = { total: Date.now() - began };
  return result;
}

// Turns of one conversation: a frontend tool the agent calls is answered in the next input (its result
// message), an interrupt (an approval the agent waits on) in the next input's `resume`.
async function turns() {
  const agent = new HttpAgent({
    url: `${args.url}/agui`,
    threadId: args.threadId,
    initialMessages: [{ id: "u-1", role: "user", content: args.prompt }],
  });
  const runs = [];
  let resume;
  for (const [index, runId] of args.runIds.entries()) {
    const events = [];
    let error = null;
    let finished = null;
    try {
      await agent.runAgent(
        { runId, tools: args.tools ?? [], ...(resume ? { resume } : {}) },
        {
          onEvent: ({ event }) => void events.push(event),
          onRunFinishedEvent: (params) =>
            void (finished = {
              outcome: params.outcome,
              pending: params.pendingToolCallIds ?? [],
              ...(params.interrupts ? { interrupts: params.interrupts } : {}),
            }),
        },
      );
    } catch (caught) {
      error = describe(caught);
    }
    runs.push({ runId, error, events, finished, messages: structuredClone(agent.messages) });
    if (index + 1 < args.runIds.length) {
      resume = finished?.outcome === "interrupt"
        ? finished.interrupts.map((i) => ({ interruptId: i.id, status: "resolved", payload: args.payload }))
        : undefined;
      for (const id of finished?.pending ?? []) {
        agent.addMessage({ id: `tool-${id}`, role: "tool", toolCallId: id, content: args.answer });
      }
    }
  }
  return { runs };
}

async function verify() {
  const cases = JSON.parse(readFileSync(args.file, "utf8"));
  const out = {};
  for (const [name, events] of Object.entries(cases)) {
    try {
      for (const event of events) EventSchema.parse(event);
      await lastValueFrom(from(events).pipe(verifyEvents(false), toArray()));
      out[name] = null;
    } catch (caught) {
      out[name] = describe(caught).message;
    }
  }
  return out;
}

const scenarios = { httpagent, tanstack, turns, verify };
const run = scenarios[scenario];
if (!run) {
  console.error(`unknown scenario ${scenario}; one of ${Object.keys(scenarios).join(", ")}`);
  process.exit(2);
}
const out = await run();
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
