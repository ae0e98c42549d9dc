"""The test helpers themselves, where a fault in them would show up only as
a rare failure of some other test."""
import rbtest


def test_free_port_never_repeats_a_port():
    ports = [rbtest.free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)
