"""Policies you can see in effect (README, "Policies in effect"):
GET /v1/queues lists every queue rebound has seen deliveries from, with the
policy that matched it (or "none: passes through"), what it does, and its
counts; a policy that matched no queue, a queue whose consumers are all
no-ack and one whose requeues all went to the broker are flagged there and
in /v1/status, and logged once after --policy-check-after."""
import json

import rbtest
from retryhelp import PoisonConsumer, direct, dlq, pump, wait_counts
from test_admin import admin_rebound, get

assert direct  # a fixture


def config(tmp_path, prefix):
    p = tmp_path / "view.yaml"
    p.write_text(
        "retry:\n  policies:\n"
        "    - queues: [\"%s-retry-*\"]\n      tiers: [200ms]\n"
        "      max_attempts: 2\n"
        "    - queues: [\"%s-never-*\"]\n      tiers: [5s]\n"
        "    - queues: [\"amq.gen-*\"]\n      tiers: [200ms]\n"
        % (prefix, prefix))
    return str(p)


def queues_doc(rb):
    status, headers, body = get(rb.admin_port, "/v1/queues")
    assert status == 200 and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    return doc, {q["name"]: q for q in doc["queues"]}


def test_queues_policies_and_flags(rebound_factory, broker, ctl, direct,
                                   tmp_path):
    pre = rbtest.uniq("view")
    qa, qb, qc = (direct.own("%s-retry-a" % pre), direct.own("%s-retry-b" % pre),
                  direct.own("%s-plain" % pre))
    direct.own(dlq(qa))
    rb = admin_rebound(rebound_factory, "--config", config(tmp_path, pre),
                       "--policy-check-after", "1s")
    conn = rb.pika(broker)
    ch = conn.channel()
    for q in (qa, qb, qc):
        ch.queue_declare(q, durable=True)
    # qa: a poison message, retried once then dead-lettered
    ch.basic_publish("", qa, b"poison")
    cons = PoisonConsumer(conn, ch, qa)
    cons.wait(2, timeout=10)
    cons.cancel()
    wait_counts(ctl, {dlq(qa): (1, 0)})
    # qb: only a no-ack consumer
    for i in range(3):
        ch.basic_publish("", qb, b"b%d" % i)
    got = []
    tag = ch.basic_consume(qb, lambda c, m, p, b: got.append(b), auto_ack=True)
    pump(conn, lambda: len(got) == 3, 10, "three no-ack deliveries")
    ch.basic_cancel(tag)
    # qc: no policy, one requeue and an ack
    ch.basic_publish("", qc, b"c")
    m, _, _ = ch.basic_get(qc)
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, _, _ = ch.basic_get(qc)
    ch.basic_ack(m.delivery_tag)
    # a server-named queue: the policy matches, but rebound may not declare
    # amq.* tiers, so every requeue goes to the broker (after the delay)
    anon = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", anon, b"x")
    m, _, _ = ch.basic_get(anon)
    ch.basic_nack(m.delivery_tag, requeue=True)
    rbtest.wait_until(lambda: queues_doc(rb)[1].get(anon, {}).get("requeued"),
                      10, "the delayed requeue counted")

    doc, by = queues_doc(rb)
    a = by[qa]
    assert a["policy_index"] == 0 and a["policy"]["max_attempts"] == 2
    assert a["policy"]["tiers"] == ["200ms"]
    assert (a["delivered"], a["retried"], a["dead_lettered"],
            a["requeued"]) == (2, 1, 1, 0), a
    assert a["flags"] == []
    b = by[qb]
    assert (b["delivered"], b["delivered_no_ack"]) == (0, 3), b
    assert [f.split(":")[0] for f in b["flags"]] == ["no-ack"]
    c = by[qc]
    assert c["policy"] == "none: passes through"
    assert (c["delivered"], c["requeued"], c["retried"]) == (2, 1, 0), c
    assert c["flags"] == []
    n = by[anon]
    assert n["policy_index"] == 2 and n["requeued"] == 1 and not n["retried"]
    assert [f.split(":")[0] for f in n["flags"]] == ["fallback"]
    pols = doc["policies"]
    assert [p["queues_matched"] for p in pols] == [2, 0, 1], pols
    assert pols[1]["flags"] == [
        "unmatched: no queue seen since start matched it"]
    assert not pols[0]["flags"] and not pols[2]["flags"]

    # /v1/status: the flagged queues and the policies
    status, _, body = get(rb.admin_port, "/v1/status")
    eff = json.loads(body)["in_effect"]
    assert eff["queues_seen"] >= 4
    assert sorted(q["name"] for q in eff["flagged"]) == sorted([qb, anon])
    assert [p["queues_matched"] for p in eff["policies"]] == [2, 0, 1]

    # logged once each, after --policy-check-after
    lines = rbtest.wait_until(
        lambda: (lambda u, q: (u, q) if u and len(q) >= 2 else None)(
            rb.log_lines("policy_unmatched"),
            rb.log_lines("queue_policy_ineffective")), 10, "the checks logged")
    unmatched, ineffective = lines
    # policy 1 never matches; 0 and 2 may be logged too if their first
    # queue came later than --policy-check-after (1 s) on a slow machine
    logged = [l["policy_index"] for l in unmatched]
    assert "1" in logged and len(set(logged)) == len(logged), logged
    never = [l for l in unmatched if l["policy_index"] == "1"][0]
    assert never["first_glob"] == "%s-never-*" % pre
    assert sorted((l["queue"], l["why"].split(":")[0]) for l in ineffective) \
        == sorted([(qb, "no-ack"), (anon, "fallback")])
    conn.sleep(1.5)
    assert len(rb.log_lines("policy_unmatched")) == len(unmatched)
    assert len(rb.log_lines("queue_policy_ineffective")) == 2
    conn.close()


def test_nothing_flagged_before_anything_is_seen(rebound_factory, tmp_path):
    """A fresh rebound lists no queue; every policy is unmatched in the
    document, but nothing is logged before --policy-check-after."""
    rb = admin_rebound(rebound_factory, "--config",
                       config(tmp_path, "fresh"), "--policy-check-after", "1h")
    doc, by = queues_doc(rb)
    assert by == {} and doc["other"] is None
    assert [p["queues_matched"] for p in doc["policies"]] == [0, 0, 0]
    assert all(p["flags"] for p in doc["policies"])
    assert not rb.log_lines("policy_unmatched")
