"""The admin page (GET /) in a real browser: a poison message parked in
Q.dlq through rebound is shown on the page (body, reason max-attempts,
source queue) after logging in with the broker's user, and the page's
Redrive button moves it back to Q, where it arrives with its body and
application headers, without rebound-retry-count and with
rebound-redriven-at; Q and Q.dlq are empty afterwards.

The browser part is tests/integration/web/dlq_page.mjs (Node, playwright-
core, headless /usr/bin/chromium); scripts/setup.sh installs both.
"""
import os
import shutil
import subprocess
from datetime import datetime

import pika
import pytest

import rbtest
from retryhelp import (PoisonConsumer, assert_props_kept, direct, dlq,
                       wait_counts)
from test_admin import admin_rebound, get

assert direct  # a fixture

WEB = os.path.join(rbtest.REPO, "tests", "integration", "web")
SCRIPT = os.path.join(WEB, "dlq_page.mjs")
CHROMIUM = os.environ.get("REBOUND_CHROMIUM", "/usr/bin/chromium")
NODE = shutil.which("node")

# markup in an untrusted body must stay text on the page
BODY = '{"order": 7, "note": "<img src=x id=pwned> caf\u00e9"}'


def _why_skip():
    if not NODE:
        return "needs node (scripts/setup.sh installs it)"
    if not os.access(CHROMIUM, os.X_OK):
        return "needs %s (scripts/setup.sh installs chromium)" % CHROMIUM
    if not os.path.isdir(os.path.join(WEB, "node_modules", "playwright-core")):
        return ("needs %s/node_modules/playwright-core (scripts/setup.sh runs "
                "npm ci there)" % WEB)
    return None


def park_one(rb, broker, ctl, direct):
    """Publish one message through rebound to a fresh queue and fail it
    until rebound parks it in the queue's DLQ; returns (queue, props)."""
    q = direct.own(rbtest.uniq("dlqpage"))
    direct.own(dlq(q))
    props = pika.BasicProperties(content_type="application/json",
                                 delivery_mode=2, message_id="page-1",
                                 headers={"app": "orders", "n": 7})
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", q, BODY.encode(), props, mandatory=True)
    cons = PoisonConsumer(conn, ch, q)
    cons.wait(2, timeout=15)
    wait_counts(ctl, {dlq(q): (1, 0), q: (0, 0)}, timeout=15)
    cons.cancel()
    conn.close()
    return q, props


def test_page_shows_and_redrives_a_parked_message(rebound_factory, broker,
                                                   ctl, direct):
    why = _why_skip()
    if why:
        pytest.skip(why)
    rb = admin_rebound(rebound_factory, "--retry-tiers", "100ms",
                       "--max-attempts", "2")
    status, headers, page = get(rb.admin_port, "/")
    assert status == 200, (status, page[:500])
    assert headers["Content-Type"].startswith("text/html"), headers
    for elem in ('id="user"', 'id="password"', 'id="login"', 'id="dlqs"',
                 'id="redrive"', 'id="purge"', 'id="status"'):
        assert elem in page, elem

    q, props = park_one(rb, broker, ctl, direct)

    p = subprocess.run(
        [NODE, SCRIPT, "http://127.0.0.1:%d" % rb.admin_port, broker.user,
         broker.password, dlq(q), BODY, q],
        cwd=WEB, capture_output=True, text=True, timeout=180)
    print(p.stdout)
    assert p.returncode == 0, "dlq_page.mjs failed (%d):\n%s\n%s" % (
        p.returncode, p.stdout, p.stderr)

    # the redriven message, straight from the broker
    got = direct.get_all(q, expect=1)
    assert len(got) == 1, got
    _, gp, body = got[0]
    assert body == BODY.encode()
    h = gp.headers or {}
    assert "rebound-retry-count" not in h, h
    assert "rebound-dead-letter-reason" not in h, h
    assert isinstance(h.get("rebound-redriven-at"), datetime), h
    assert h["rebound-source-queue"] == q
    assert_props_kept(gp, props)
    # nothing left behind, nothing sent twice
    wait_counts(ctl, {q: (0, 0), dlq(q): (0, 0)})
    assert direct.get_all(q) == []
