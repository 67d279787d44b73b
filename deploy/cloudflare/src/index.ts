/**
 * boxwright's Cloudflare Worker: the Sandbox Durable Object (`@cloudflare/sandbox`) over authenticated
 * HTTP, because a Python process has no Durable Object binding (spec §2.7, CF1).
 *
 * Every request needs `Authorization: Bearer <BOXWRIGHT_TOKEN>` (a Worker secret). Routes, all under
 * `/v1/sandboxes/{id}` (the id names the Durable Object, so a sandbox exists from first use):
 *   POST /exec         {command, env?, cwd?} -> {stdout, stderr, exitCode, success}
 *   POST /exec/stream  same body -> NDJSON: {type: "stdout"|"stderr", data}... then {type: "complete", exitCode}
 *                      or {type: "error", error}
 *   POST /env          {envVars} -> {}   (the env of every later command: how secrets go in)
 *   POST /mkdir        {path} -> {}
 *   POST /ports        {port, hostname} -> {url}   (a preview URL on `hostname`, a wildcard route of this Worker)
 *   DELETE             -> {}   (destroy)
 * Other requests are preview traffic for exposed ports (`proxyToSandbox`). Bodies are never logged:
 * they carry secrets. No AbortSignal crosses Workers RPC, so there is no kill route (killable false).
 */
import { getSandbox, parseSSEStream, proxyToSandbox, type ExecEvent, type Sandbox } from "@cloudflare/sandbox";

export { Sandbox } from "@cloudflare/sandbox";

interface Env {
  Sandbox: DurableObjectNamespace<Sandbox>;
  BOXWRIGHT_TOKEN: string;
}

interface ExecBody {
  command: string;
  env?: Record<string, string>;
  cwd?: string;
}

const ROUTE = /^\/v1\/sandboxes\/([A-Za-z0-9][A-Za-z0-9._-]{0,62})(?:\/(exec|exec\/stream|env|mkdir|ports))?$/;

function json(value: unknown, status = 200): Response {
  return new Response(JSON.stringify(value), { status, headers: { "content-type": "application/json" } });
}

/** Constant-time comparison: the token check must not leak its prefix through timing. */
function same(a: string, b: string): boolean {
  const x = new TextEncoder().encode(a);
  const y = new TextEncoder().encode(b);
  let diff = x.length ^ y.length;
  for (let i = 0; i < Math.max(x.length, y.length); i++) diff |= (x[i] ?? 0) ^ (y[i] ?? 0);
  return diff === 0;
}

async function stream(sandbox: DurableObjectStub<Sandbox>, body: ExecBody): Promise<Response> {
  const encoder = new TextEncoder();
  const { readable, writable } = new TransformStream<Uint8Array, Uint8Array>();
  const writer = writable.getWriter();
  const send = (event: unknown) => writer.write(encoder.encode(JSON.stringify(event) + "\n"));
  (async () => {
    try {
      const events = await sandbox.execStream(body.command, { env: body.env, cwd: body.cwd });
      for await (const event of parseSSEStream<ExecEvent>(events)) {
        if (event.type === "stdout" || event.type === "stderr") await send({ type: event.type, data: event.data });
        else if (event.type === "complete") await send({ type: "complete", exitCode: event.exitCode });
        else if (event.type === "error") await send({ type: "error", error: event.error });
      }
    } catch (error) {
      await send({ type: "error", error: String(error) });
    } finally {
      await writer.close();
    }
  })();
  return new Response(readable, { headers: { "content-type": "application/x-ndjson" } });
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const preview = await proxyToSandbox(request, env);
    if (preview) return preview;
    const auth = request.headers.get("authorization") ?? "";
    if (!env.BOXWRIGHT_TOKEN || !same(auth, `Bearer ${env.BOXWRIGHT_TOKEN}`)) {
      return json({ error: "unauthorized" }, 401);
    }
    const match = ROUTE.exec(new URL(request.url).pathname);
    if (!match) return json({ error: "not found" }, 404);
    const [, id, op] = match;
    const sandbox = getSandbox(env.Sandbox, id);
    try {
      if (request.method === "DELETE" && !op) {
        await sandbox.destroy();
        return json({});
      }
      if (request.method !== "POST" || !op) return json({ error: "method not allowed" }, 405);
      const body = (await request.json()) as Record<string, unknown>;
      switch (op) {
        case "exec": {
          const run = body as unknown as ExecBody;
          const result = await sandbox.exec(run.command, { env: run.env, cwd: run.cwd });
          return json({ stdout: result.stdout, stderr: result.stderr, exitCode: result.exitCode, success: result.success });
        }
        case "exec/stream":
          return stream(sandbox, body as unknown as ExecBody);
        case "env":
          await sandbox.setEnvVars(body.envVars as Record<string, string>);
          return json({});
        case "mkdir":
          await sandbox.mkdir(String(body.path), { recursive: true });
          return json({});
        case "ports": {
          const exposed = await sandbox.exposePort(Number(body.port), { hostname: String(body.hostname) });
          return json({ url: exposed.url });
        }
      }
      return json({ error: "not found" }, 404);
    } catch (error) {
      // The message only: a stack or the request body could carry a secret.
      return json({ error: error instanceof Error ? error.message : String(error) }, 500);
    }
  },
};
