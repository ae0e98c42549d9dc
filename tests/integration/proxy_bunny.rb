# Integration: Ruby's bunny (Debian's ruby-bunny) through rebound, run by
# with_rebound.sh (REBOUND_PROXY_HOST / REBOUND_PROXY_PORT).
require "minitest/autorun"
require "bunny"
require "securerandom"

class ProxyBunnyTest < Minitest::Test
  def connect(**opts)
    c = Bunny.new(host: ENV.fetch("REBOUND_PROXY_HOST"),
                  port: Integer(ENV.fetch("REBOUND_PROXY_PORT")),
                  user: "guest", pass: "guest", vhost: "/",
                  automatically_recover: false, logger: Logger.new(nil),
                  **opts)
    c.start
    c
  end

  def qname
    "bunny.#{SecureRandom.hex(6)}"
  end

  def test_publish_confirm_consume_ack
    c = connect
    ch = c.create_channel
    ch.confirm_select
    q = ch.queue(qname, exclusive: true)
    100.times { |i| ch.default_exchange.publish("m#{i}", routing_key: q.name, headers: { "i" => i }, persistent: true) }
    assert ch.wait_for_confirms, "all publishes confirmed"
    got = []
    done = Queue.new
    q.subscribe(manual_ack: true) do |info, props, body|
      got << [body, props.headers["i"], props.delivery_mode]
      ch.ack(info.delivery_tag)
      done << true if got.size == 100
    end
    Timeout.timeout(10) { done.pop }
    assert_equal (0...100).map { |i| ["m#{i}", i, 2] }, got
    c.close
  end

  def test_reject_requeue_and_get
    c = connect
    ch = c.create_channel
    q = ch.queue(qname, exclusive: true)
    ch.default_exchange.publish("again", routing_key: q.name)
    info, _props, body = q.pop(manual_ack: true)
    assert_equal "again", body
    refute info.redelivered?
    ch.reject(info.delivery_tag, true)
    info, _props, body = q.pop(manual_ack: true)
    assert_equal "again", body
    assert info.redelivered?
    ch.ack(info.delivery_tag)
    assert_nil q.pop[2]
    c.close
  end

  def test_channel_errors_reach_client
    c = connect
    ch = c.create_channel
    err = assert_raises(Bunny::NotFound) { ch.queue_declare("bunny.missing.#{SecureRandom.hex(4)}", passive: true) }
    assert_match(/NOT_FOUND/, err.message)
    name = qname
    ch2 = c.create_channel
    ch2.queue(name, arguments: { "x-message-ttl" => 1000 }, auto_delete: true)
    ch3 = c.create_channel
    err = assert_raises(Bunny::PreconditionFailed) { ch3.queue(name, arguments: { "x-message-ttl" => 2000 }, auto_delete: true) }
    assert_match(/PRECONDITION_FAILED/, err.message)
    assert c.open?, "connection still open after channel errors"
    ch4 = c.create_channel
    q = ch4.queue(qname, exclusive: true)
    ch4.default_exchange.publish("still fine", routing_key: q.name)
    sleep 0.05 until q.message_count > 0
    assert_equal "still fine", q.pop[2]
    c.close
  end

  def test_big_message_split_across_frames
    c = connect
    ch = c.create_channel
    q = ch.queue(qname, exclusive: true)
    body = SecureRandom.random_bytes(1_000_000)
    ch.default_exchange.publish(body, routing_key: q.name)
    sleep 0.05 until q.message_count > 0
    assert_equal body, q.pop[2]
    c.close
  end
end
