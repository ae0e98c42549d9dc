"""Fixtures for rebound's integration tests (pika, kombu, raw sockets)
against a real RabbitMQ, through the real rebound binary."""
import os

import pytest

import rbtest

def _why_skip():
    missing = [v for v in ("REBOUND_BIN", "REBOUND_TEST_BROKER")
               if not os.environ.get(v)]
    if missing:
        return "needs %s (run through scripts/test.sh or ctest)" % \
            " and ".join(missing)
    if not os.access(rbtest.BIN, os.X_OK):
        return "REBOUND_BIN=%s is not executable" % rbtest.BIN
    return None


SKIP_REASON = _why_skip()


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def pytest_sessionfinish(session, exitstatus):
    # ctest counts exit status 77 as "skipped" (SKIP_RETURN_CODE 77)
    if SKIP_REASON and exitstatus in (0, 5):
        session.exitstatus = 77


rbtest.raise_nofile()


@pytest.fixture(scope="session")
def broker():
    return rbtest.broker_from_env()


@pytest.fixture(scope="session")
def ctl(broker):
    """The broker's rabbitmqctl; skips the test when there is none."""
    if not broker.ctl_path or not os.path.exists(broker.ctl_path):
        pytest.skip("needs REBOUND_TEST_BROKER_DIR with a rabbitmqctl wrapper")
    return broker


@pytest.fixture
def rebound_factory(tmp_path, broker):
    """start(*args, upstream=...) -> rbtest.Rebound on a free 127.0.0.1
    port, --log-level debug, upstream = the test broker unless given.
    At teardown every rebound gets SIGTERM and must exit 0 with no
    sanitizer report in its log."""
    started = []

    def start(*args, upstream=None, **kw):
        rb = rbtest.Rebound(str(tmp_path), upstream or broker.addr, args, **kw)
        started.append(rb)
        return rb

    yield start

    problems = []
    for rb in started:
        rc = rb.stop(timeout=30)
        if rc != 0:
            problems.append("rebound %s exited with %r" % (rb.addr, rc))
        found = rb.sanitizer_report()
        if found:
            problems.append("rebound %s log has %s" % (rb.addr, ", ".join(found)))
        if problems:
            problems.append("log of %s (%s):\n%s" % (rb.addr, rb.log_path,
                                                    rb.log()[-6000:]))
    assert not problems, "\n".join(problems)


# The transparent-proxy tests run with a retry policy that matches none of
# their queues: those queues must behave exactly as direct, requeues
# included. The retry tests (test_retry_*.py) start rebound with policies of
# their own.
PASS_THROUGH = ("--retry-queues", "retry-policy-matches-nothing-here")


@pytest.fixture
def rebound(rebound_factory):
    """A rebound in front of the test broker; no queue of the test has a
    retry policy."""
    return rebound_factory(*PASS_THROUGH)


@pytest.fixture
def qname():
    """A fresh queue name for this test."""
    return rbtest.uniq("q")
