// node validate.mjs --version V [--rebound BIN] OVERLAY=FILE ...
//
// Checks the objects of rendered overlays (`kubectl kustomize` output):
//   1. each against the schema of its apiVersion and kind (kubernetes-models
//      for Kubernetes, @kubernetes-models/prometheus-operator for
//      monitoring.coreos.com; kubernetes-models 4.5.1 has the Kubernetes 1.33
//      API): types, enums, required fields;
//   2. no field that schema does not have (the API server refuses them under
//      strict field validation; the schemas themselves allow them);
//   3. Pod Security Standard "restricted" on every pod template;
//   4. what the overlay is for: rebound's container (image tag V, probes,
//      security context, shutdown time), the sidecar or standalone wiring,
//      and that every selector and port name finds its target; with
//      --rebound, that `BIN --check` accepts each rebound container's
//      ConfigMap and args.
// Prints each check; exits 1 naming every object and path that fails, 2 on
// a usage error or when the validator itself stops catching a planted
// mistake.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import yaml from "js-yaml";

const failures = [];
let passed = 0;
function ok(cond, what, detail) {
  if (cond) {
    console.log(`  ok    ${what}`);
    passed++;
  } else {
    console.log(`  FAIL  ${what}${detail ? `: ${detail}` : ""}`);
    failures.push(what);
  }
  return cond;
}

// --- schema lookup -------------------------------------------------------

async function modelFor(apiVersion, kind) {
  const spec = /^monitoring\.coreos\.com\//.test(apiVersion)
    ? `@kubernetes-models/prometheus-operator/${apiVersion}`
    : `kubernetes-models/${apiVersion}`;
  let mod;
  try {
    mod = await import(spec);
  } catch {
    return null;
  }
  const cls = mod[kind];
  return cls && typeof cls.prototype.validate === "function" ? cls : null;
}

// --- schema and unknown-field pass ----------------------------------------

const esc = (k) => String(k).replace(/~/g, "~0").replace(/\//g, "~1");

// A copy of value whose objects record what the schema's validator asks of
// them. The compiled validators look up every property their schema
// declares (present or not) and list the keys only of maps
// (additionalProperties); so a key that was neither looked up nor listed
// is unknown to the schema.
function track(value, path, nodes) {
  if (Array.isArray(value)) return value.map((v, i) => track(v, `${path}/${i}`, nodes));
  if (value === null || typeof value !== "object") return value;
  const node = { path, keys: Object.keys(value), asked: new Set(), listed: false };
  nodes.push(node);
  const copy = {};
  for (const k of node.keys) copy[k] = track(value[k], `${path}/${esc(k)}`, nodes);
  return new Proxy(copy, {
    get(t, p, r) {
      if (typeof p === "string") node.asked.add(p);
      return Reflect.get(t, p, r);
    },
    has(t, p) {
      if (typeof p === "string") node.asked.add(p);
      return Reflect.has(t, p);
    },
    ownKeys(t) {
      node.listed = true;
      return Reflect.ownKeys(t);
    },
  });
}

// Returns ["PATH: problem", ...] for one object.
async function schemaProblems(obj) {
  const cls = await modelFor(obj.apiVersion, obj.kind);
  if (!cls) return [`/: no schema for apiVersion ${obj.apiVersion}, kind ${obj.kind}`];
  const nodes = [];
  const tracked = track(obj, "", nodes);
  const problems = [];
  try {
    cls.prototype.validate.call(tracked);
  } catch (e) {
    if (!Array.isArray(e.errors)) throw e;
    for (const err of e.errors) {
      let msg = err.message || err.keyword;
      if (err.params && err.params.allowedValues) msg += ` (${err.params.allowedValues.join(", ")})`;
      problems.push(`${err.instancePath || "/"}: ${msg}`);
    }
  }
  const unknown = [];
  for (const n of nodes) {
    if (n.listed) continue;
    for (const k of n.keys) if (!n.asked.has(k)) unknown.push(`${n.path}/${esc(k)}`);
  }
  unknown.sort();
  let last = null;
  for (const p of unknown) {
    if (last && p.startsWith(`${last}/`)) continue; // inside an unknown field
    problems.push(`${p}: unknown field`);
    last = p;
  }
  return [...new Set(problems)];
}

// The pass above must catch a wrong type and an unknown field; a library
// update that stopped it would otherwise pass everything silently.
async function selfCheck() {
  const planted = {
    apiVersion: "v1", kind: "Pod", metadata: { name: "planted" },
    spec: { containers: [{ name: "c", image: "i:1",
      securityContext: { runAsNonRot: true }, ports: [{ containerPort: "80" }] }] },
  };
  const got = (await schemaProblems(planted)).join("\n");
  const want = ["/spec/containers/0/securityContext/runAsNonRot: unknown field",
    "/spec/containers/0/ports/0/containerPort: must be integer"];
  for (const w of want) {
    if (!got.includes(w)) {
      console.error(`validate: self-check: "${w}" was not reported; got:\n${got}`);
      process.exit(2);
    }
  }
}

// --- Pod Security Standard "restricted" -----------------------------------

const VOLUME_TYPES = new Set(["configMap", "csi", "downwardAPI", "emptyDir",
  "ephemeral", "persistentVolumeClaim", "projected", "secret"]);
const SAFE_SYSCTLS = new Set(["kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
  "net.ipv4.ip_local_reserved_ports", "net.ipv4.ip_unprivileged_port_start",
  "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.tcp_keepalive_time",
  "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"]);
const SELINUX_TYPES = new Set(["", "container_t", "container_init_t", "container_kvm_t",
  "container_engine_t"]);

function podTemplates(obj) {
  const s = obj.spec || {};
  switch (obj.kind) {
    case "Pod": return [{ meta: obj.metadata || {}, spec: s, path: "/spec" }];
    case "Deployment": case "StatefulSet": case "DaemonSet": case "ReplicaSet": case "Job":
      return s.template ? [{ meta: s.template.metadata || {}, spec: s.template.spec || {},
        path: "/spec/template/spec" }] : [];
    case "CronJob": {
      const t = s.jobTemplate?.spec?.template;
      return t ? [{ meta: t.metadata || {}, spec: t.spec || {},
        path: "/spec/jobTemplate/spec/template/spec" }] : [];
    }
    default: return [];
  }
}

function allContainers(spec, path) {
  const out = [];
  for (const list of ["initContainers", "containers", "ephemeralContainers"])
    (spec[list] || []).forEach((c, i) => out.push({ c, path: `${path}/${list}/${i}` }));
  return out;
}

function restrictedProblems(meta, spec, path) {
  const p = [];
  const psc = spec.securityContext || {};
  for (const f of ["hostNetwork", "hostPID", "hostIPC"])
    if (spec[f]) p.push(`${path}/${f}: must be unset or false`);
  (spec.volumes || []).forEach((v, i) => {
    for (const k of Object.keys(v))
      if (k !== "name" && !VOLUME_TYPES.has(k)) p.push(`${path}/volumes/${i}/${k}: volume type not allowed`);
  });
  for (const [k, v] of Object.entries(meta.annotations || {}))
    if (k.startsWith("container.apparmor.security.beta.kubernetes.io/") &&
        v !== "runtime/default" && !v.startsWith("localhost/"))
      p.push(`metadata/annotations/${k}: AppArmor must be runtime/default or localhost/*`);
  (psc.sysctls || []).forEach((s, i) => {
    if (!SAFE_SYSCTLS.has(s.name)) p.push(`${path}/securityContext/sysctls/${i}: sysctl ${s.name} not allowed`);
  });
  const secBoth = (sc, at) => {
    if (sc.windowsOptions?.hostProcess) p.push(`${at}/windowsOptions/hostProcess: must be unset or false`);
    if (sc.runAsUser === 0) p.push(`${at}/runAsUser: must not be 0`);
    if (sc.appArmorProfile && !["RuntimeDefault", "Localhost"].includes(sc.appArmorProfile.type))
      p.push(`${at}/appArmorProfile/type: must be RuntimeDefault or Localhost`);
    const se = sc.seLinuxOptions;
    if (se && (!SELINUX_TYPES.has(se.type || "") || se.user || se.role))
      p.push(`${at}/seLinuxOptions: type not allowed, or user/role set`);
  };
  secBoth(psc, `${path}/securityContext`);
  const podSeccomp = psc.seccompProfile?.type;
  if (podSeccomp !== undefined && !["RuntimeDefault", "Localhost"].includes(podSeccomp))
    p.push(`${path}/securityContext/seccompProfile/type: must be RuntimeDefault or Localhost`);
  for (const { c, path: cp } of allContainers(spec, path)) {
    const sc = c.securityContext || {};
    const at = `${cp}/securityContext`;
    secBoth(sc, at);
    if (sc.privileged) p.push(`${at}/privileged: must be unset or false`);
    if (sc.allowPrivilegeEscalation !== false) p.push(`${at}/allowPrivilegeEscalation: must be false`);
    if (sc.procMount && sc.procMount !== "Default") p.push(`${at}/procMount: must be Default`);
    if (sc.runAsNonRoot === false || (sc.runAsNonRoot !== true && psc.runAsNonRoot !== true))
      p.push(`${at}/runAsNonRoot: must be true (here or in the pod's securityContext)`);
    const sec = sc.seccompProfile?.type;
    if (sec !== undefined ? !["RuntimeDefault", "Localhost"].includes(sec) : podSeccomp === undefined)
      p.push(`${at}/seccompProfile/type: must be RuntimeDefault or Localhost (here or in the pod's securityContext)`);
    const caps = sc.capabilities || {};
    if (!(caps.drop || []).includes("ALL")) p.push(`${at}/capabilities/drop: must include ALL`);
    for (const a of caps.add || [])
      if (a !== "NET_BIND_SERVICE") p.push(`${at}/capabilities/add: ${a} not allowed`);
    (c.ports || []).forEach((port, i) => {
      if (port.hostPort) p.push(`${cp}/ports/${i}/hostPort: must be unset or 0`);
    });
  }
  return p;
}

// --- rebound-specific checks ----------------------------------------------

const CONFIG_DIR = "/etc/rebound";

function seconds(d) {
  if (typeof d === "number") return d;
  let total = 0;
  const s = String(d);
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s);
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h)/g;
  let m;
  let used = 0;
  while ((m = re.exec(s))) {
    total += Number(m[1]) * { ms: 0.001, s: 1, m: 60, h: 3600 }[m[2]];
    used += m[0].length;
  }
  return used === s.length ? total : NaN;
}

const imageRepo = (img) => img.replace(/@.*$/, "").replace(/:[^:/]*$/, "");
const imageTag = (img) => (/@/.test(img) ? null : (img.match(/:([^:/]+)$/) || [])[1] || null);
const isRebound = (c) => imageRepo(c.image || "").split("/").pop() === "rebound";
const subset = (sel, labels) =>
  Object.keys(sel || {}).length > 0 &&
  Object.entries(sel).every(([k, v]) => (labels || {})[k] === v);
const name = (o) => `${o.kind}/${o.metadata?.name}`;

function argValue(args, flag) {
  for (let i = 0; i < (args || []).length; i++) {
    if (args[i] === flag) return args[i + 1];
    if (args[i].startsWith(`${flag}=`)) return args[i].slice(flag.length + 1);
  }
  return undefined;
}

function portOf(addr) {
  const m = String(addr).match(/:(\d+)$/);
  return m ? Number(m[1]) : NaN;
}

// The rebound container of a pod template, its settings (config file,
// overridden by args) and its place.
function reboundIn(objects) {
  const found = [];
  for (const o of objects)
    for (const t of podTemplates(o))
      for (const { c, path } of allContainers(t.spec, t.path))
        if (isRebound(c)) found.push({ obj: o, tpl: t, c, path });
  return found;
}

// `rebound --check` with the container's args, its config file replaced by
// the ConfigMap's content.
function reboundCheck(bin, where, args, config) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "k8s-validate-"));
  try {
    const file = path.join(dir, "rebound.yaml");
    fs.writeFileSync(file, config);
    const argv = (args || []).map((a) => a.replace(`${CONFIG_DIR}/rebound.yaml`, file));
    const r = spawnSync(bin, ["--check", ...argv], { encoding: "utf8" });
    ok(r.status === 0, `${where}: rebound --check accepts its ConfigMap and args`,
      `exit ${r.status}: ${(r.stderr || "") + (r.stdout || "")}`.trim());
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

function checkRebound(objects, version, r, cmByName, bin) {
  const { obj, tpl, c } = r;
  const where = `${name(obj)} ${c.name}`;
  const tag = imageTag(c.image);
  ok(tag === version, `${where}: image ${c.image} is tagged ${version}`);
  ok(c.imagePullPolicy === "IfNotPresent", `${where}: imagePullPolicy IfNotPresent`, c.imagePullPolicy);
  const sc = c.securityContext || {};
  const psc = tpl.spec.securityContext || {};
  ok(sc.readOnlyRootFilesystem === true, `${where}: readOnlyRootFilesystem`);
  ok((sc.runAsUser ?? psc.runAsUser) === 65532, `${where}: runs as 65532`);
  // Its config: --config FILE from a ConfigMap volume mounted at CONFIG_DIR.
  const file = argValue(c.args, "--config");
  ok(file === `${CONFIG_DIR}/rebound.yaml`, `${where}: --config ${CONFIG_DIR}/rebound.yaml`, file);
  const mount = (c.volumeMounts || []).find((m) => m.mountPath === CONFIG_DIR);
  const vol = mount && (tpl.spec.volumes || []).find((v) => v.name === mount.name);
  const cm = vol?.configMap && cmByName.get(vol.configMap.name);
  let cfg = {};
  if (ok(cm && typeof cm.data?.["rebound.yaml"] === "string",
      `${where}: ${CONFIG_DIR} is ConfigMap ${vol?.configMap?.name} with rebound.yaml`)) {
    cfg = yaml.load(cm.data["rebound.yaml"]) || {};
    if (bin) reboundCheck(bin, where, c.args, cm.data["rebound.yaml"]);
  }
  const settings = {
    listen: argValue(c.args, "--listen") ?? cfg.listen ?? "127.0.0.1:5673",
    admin: argValue(c.args, "--admin") ?? cfg.admin ?? "127.0.0.1:9900",
    ready: String(argValue(c.args, "--ready-needs-upstream") ?? cfg.ready_needs_upstream ?? "on"),
    drain: seconds(argValue(c.args, "--drain-timeout") ?? cfg.drain_timeout ?? "10s"),
  };
  // Probes on the admin port, which must be reachable on the pod IP.
  const adminPort = portOf(settings.admin);
  const named = (c.ports || []).find((p) => p.name === "admin");
  ok(named && named.containerPort === adminPort && !/^(127\.|\[::1\]|localhost)/.test(settings.admin),
    `${where}: port admin is the admin endpoint ${settings.admin} on the pod IP`);
  const probe = (kind, pathWant) => {
    const g = c[kind]?.httpGet;
    ok(g && g.path === pathWant && (g.port === "admin" || g.port === adminPort),
      `${where}: ${kind} GET ${pathWant} on the admin port`, JSON.stringify(c[kind]));
  };
  probe("readinessProbe", "/readyz");
  probe("livenessProbe", "/healthz");
  // Shutdown: preStop, then the drain, within the grace period.
  const pre = c.lifecycle?.preStop;
  const preSecs = pre?.sleep ? pre.sleep.seconds
    : pre?.exec && /sleep$/.test(pre.exec.command?.[0] || "") ? Number(pre.exec.command[1]) : 0;
  const grace = tpl.spec.terminationGracePeriodSeconds ?? 30;
  ok(grace > preSecs + settings.drain,
    `${where}: terminationGracePeriodSeconds ${grace} > preStop ${preSecs}s + drain_timeout ${settings.drain}s`);
  return { ...settings, preSecs };
}

function checkSelectors(objects) {
  const pods = objects.flatMap((o) => podTemplates(o).map((t) => ({ o, t })));
  const services = objects.filter((o) => o.kind === "Service");
  for (const o of objects) {
    if (o.kind === "Deployment")
      ok(subset(o.spec.selector?.matchLabels, o.spec.template?.metadata?.labels),
        `${name(o)}: selector matches its pod template`);
    if (o.kind === "PodDisruptionBudget")
      ok(pods.some(({ t }) => subset(o.spec.selector?.matchLabels, t.meta.labels)),
        `${name(o)}: selector matches a pod template`);
    if (o.kind === "Service") {
      const hit = pods.filter(({ t }) => subset(o.spec.selector, t.meta.labels));
      ok(hit.length > 0, `${name(o)}: selector matches a pod template`);
      for (const port of o.spec.ports || []) {
        const target = port.targetPort ?? port.port;
        ok(hit.some(({ t }) => allContainers(t.spec, "").some(({ c }) =>
          (c.ports || []).some((cp) => cp.name === target || cp.containerPort === target))),
        `${name(o)}: port ${port.name} targets container port ${target}`);
      }
    }
    if (o.kind === "ServiceMonitor") {
      const hit = services.filter((s) => subset(o.spec.selector?.matchLabels, s.metadata.labels));
      ok(hit.length > 0, `${name(o)}: selector matches a Service`);
      for (const ep of o.spec.endpoints || [])
        ok(hit.some((s) => (s.spec.ports || []).some((p) => p.name === ep.port)) && ep.path === "/metrics",
          `${name(o)}: endpoint ${ep.path} on Service port ${ep.port}`);
    }
    if (o.kind === "PodMonitor") {
      const hit = pods.filter(({ t }) => subset(o.spec.selector?.matchLabels, t.meta.labels));
      ok(hit.length > 0, `${name(o)}: selector matches a pod template`);
      for (const ep of o.spec.podMetricsEndpoints || [])
        ok(hit.some(({ t }) => allContainers(t.spec, "").some(({ c }) =>
          (c.ports || []).some((p) => p.name === ep.port))) && ep.path === "/metrics",
        `${name(o)}: endpoint ${ep.path} on container port ${ep.port}`);
    }
  }
}

function checkSidecar(objects, found, settings) {
  const side = found.filter((r) => r.path.includes("/initContainers/"));
  ok(side.length === 1 && found.length === 1, "sidecar: rebound is an init container, and only there");
  if (!side.length) return;
  const { obj, tpl, c } = side[0];
  ok(c.restartPolicy === "Always", `${name(obj)} ${c.name}: restartPolicy Always (a native sidecar)`);
  ok(c.startupProbe?.httpGet, `${name(obj)} ${c.name}: startupProbe, so the app starts once rebound listens`);
  ok(/^(127\.0\.0\.1|localhost):/.test(settings.listen),
    `sidecar: rebound listens on the loopback only (${settings.listen})`);
  ok(settings.ready === "off" || settings.ready === "false",
    "sidecar: ready_needs_upstream off (a broker outage does not take the pod out of service)");
  const port = String(portOf(settings.listen));
  const apps = tpl.spec.containers || [];
  ok(apps.length > 0, `${name(obj)}: has an app container`);
  for (const a of apps) {
    const env = Object.fromEntries((a.env || []).map((e) => [e.name, e.value]));
    let url;
    try { url = new URL(env.AMQP_URL); } catch { url = null; }
    ok(url && url.protocol === "amqp:" && ["127.0.0.1", "localhost"].includes(url.hostname) &&
      (url.port || "5672") === port, `${name(obj)} ${a.name}: AMQP_URL points at rebound (${env.AMQP_URL})`);
    ok(["127.0.0.1", "localhost"].includes(env.RABBITMQ_HOST) && env.RABBITMQ_PORT === port,
      `${name(obj)} ${a.name}: RABBITMQ_HOST/PORT point at rebound (${env.RABBITMQ_HOST}:${env.RABBITMQ_PORT})`);
  }
  ok(objects.some((o) => o.kind === "PodMonitor"), "sidecar: has a PodMonitor");
}

function checkStandalone(objects, found, settings) {
  const main = found.filter((r) => r.path.includes("/containers/") && r.obj.kind === "Deployment");
  ok(main.length === 1 && found.length === 1, "standalone: a Deployment runs rebound as its container");
  if (!main.length) return;
  const { obj, tpl } = main[0];
  ok((obj.spec.replicas ?? 1) >= 2, `${name(obj)}: replicas ${obj.spec.replicas} >= 2`);
  ok(!/^(127\.|\[::1\]|localhost)/.test(settings.listen),
    `standalone: rebound listens beyond the loopback (${settings.listen})`);
  ok(settings.preSecs > 0, `${name(obj)}: preStop waits ${settings.preSecs}s for the endpoints to go`);
  ok((tpl.spec.topologySpreadConstraints || []).length > 0 ||
    tpl.spec.affinity?.podAntiAffinity, `${name(obj)}: replicas spread (topology spread or anti-affinity)`);
  for (const kind of ["Service", "PodDisruptionBudget", "ServiceMonitor"])
    ok(objects.some((o) => o.kind === kind), `standalone: has a ${kind}`);
  const svc = objects.find((o) => o.kind === "Service");
  const names = (svc?.spec.ports || []).map((p) => p.targetPort);
  ok(names.includes("amqp") && names.includes("admin"), "standalone: the Service carries the amqp and admin ports");
}

// --- main -------------------------------------------------------------------

async function main() {
  const argv = process.argv.slice(2);
  let version = null;
  let bin = null;
  const overlays = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--version") version = argv[++i];
    else if (argv[i] === "--rebound") bin = argv[++i];
    else if (/^[a-z-]+=/.test(argv[i])) {
      const [n, ...f] = argv[i].split("=");
      overlays.push({ name: n, file: f.join("=") });
    } else {
      console.error("usage: node validate.mjs --version V [--rebound BIN] OVERLAY=FILE ...");
      process.exit(2);
    }
  }
  if (!overlays.length || !version) {
    console.error("usage: node validate.mjs --version V [--rebound BIN] OVERLAY=FILE ...");
    process.exit(2);
  }
  await selfCheck();
  console.log("self-check: a planted unknown field and wrong type are reported");
  if (!bin) console.log("rebound --check: not run (no --rebound BIN)");
  for (const ov of overlays) {
    const objects = yaml.loadAll(fs.readFileSync(ov.file, "utf8")).filter(Boolean);
    console.log(`${ov.name}: ${objects.length} objects: ${objects.map(name).join(", ")}`);
    for (const o of objects) {
      const what = o.apiVersion.includes("/") ? o.apiVersion.split("/")[0] : "core";
      const problems = await schemaProblems(o);
      if (problems.length === 0) ok(true, `${name(o)}: schema (${what} ${o.apiVersion.split("/").pop()}), no unknown fields`);
      for (const pr of problems) ok(false, name(o), pr);
    }
    for (const o of objects) {
      for (const t of podTemplates(o)) {
        const pr = restrictedProblems(t.meta, t.spec, t.path);
        const n = allContainers(t.spec, "").length;
        if (!pr.length) ok(true, `${name(o)}: Pod Security restricted (${n} container${n === 1 ? "" : "s"})`);
        for (const p of pr) ok(false, `${name(o)}: Pod Security restricted`, p);
        for (const { c, path } of allContainers(t.spec, t.path)) {
          const tag = imageTag(c.image || "");
          ok(tag && tag !== "latest", `${name(o)} ${c.name}: image ${c.image} has a version tag`, path);
        }
      }
    }
    const cmByName = new Map(objects.filter((o) => o.kind === "ConfigMap").map((o) => [o.metadata.name, o]));
    const found = reboundIn(objects);
    let settings = {};
    for (const r of found) settings = checkRebound(objects, version, r, cmByName, bin);
    checkSelectors(objects);
    if (ov.name === "sidecar") checkSidecar(objects, found, settings);
    else if (ov.name === "standalone") checkStandalone(objects, found, settings);
    else ok(false, `${ov.name}: an overlay this validator knows (sidecar, standalone)`);
  }
  console.log(`validate: ${passed} passed, ${failures.length} failed`);
  if (failures.length) process.exit(1);
}

await main();
