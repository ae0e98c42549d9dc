#!/usr/bin/ruby
# Golden session "bunny" (ruby-bunny 2.19 / amq-protocol 2.3, Debian's ruby).
#
#   session_bunny.rb BROKER_URL RELAY_PORT
#
# Cleans leftovers directly on BROKER_URL, then through the relay: heartbeat left to
# the server's value, a queue with an 'l' (int64) argument, publisher confirms,
# bunny's field types (Integer is 'l', Float 'd', Float32Bit 'f', Time 'T'), and a
# consumer with a SERVER-generated tag (empty consumer-tag in basic.consume).
# Values are documented in MANIFEST.md; change both together.
require "bunny"

QUEUE = "golden.bunny.q"
HEADERS = {
  "b.int" => 42,                                      # l
  "b.float" => 2.5,                                   # d
  "b.float32" => AMQ::Protocol::Float32Bit.new(1.5),  # f, but little-endian on the wire!
  "b.time" => Time.at(1_700_000_000),                 # T
  "b.bool" => false,                                  # t
  "b.str" => "bunny",                                 # S
  "b.nil" => nil,                                     # V
  "b.array" => [1, "x"],                              # A [l S]
  "b.hash" => { "k" => "v" },                         # F
}.freeze
BODIES = ["bunny one", "bunny two"].freeze

broker_url, relay_port = ARGV

# Cleanup (not recorded). A trailing "/" in an AMQP URI means vhost "" to bunny: drop it.
c = Bunny.new(broker_url.sub(%r{/\z}, ""), automatically_recover: false, logger: Logger.new(nil))
c.start
c.create_channel.queue_delete(QUEUE)
c.close

conn = Bunny.new(host: "127.0.0.1", port: relay_port.to_i, username: "guest",
                 password: "guest", vhost: "/", automatically_recover: false,
                 connection_name: "golden-bunny", logger: Logger.new(nil))
conn.start                                   # PLAIN, heartbeat = server's 60
ch = conn.create_channel                     # channel 1
q = ch.queue(QUEUE, durable: false, auto_delete: false,
                    arguments: { "x-max-length" => 100 })
ch.confirm_select
ch.prefetch(2)

# Consume before publishing: bunny registers a server-named consumer only after
# consume-ok, so deliveries of messages already queued could race past it.
got = []
done = Queue.new
ok = ch.basic_consume(q, "", false) do |di, _props, body|   # "" -> amq.ctag-...
  got << body
  ch.ack(di.delivery_tag)
  done << true if got.size == BODIES.size
end
BODIES.each_with_index do |body, i|
  ch.default_exchange.publish(body, routing_key: QUEUE, persistent: true,
                                    content_type: "text/plain",
                                    message_id: "golden-bunny-#{i + 1}",
                                    timestamp: 1_700_000_000 + i, headers: HEADERS)
end
raise "nacked" unless ch.wait_for_confirms
Timeout.timeout(10) { done.pop }
ch.basic_cancel(ok.consumer_tag)
ch.queue_delete(QUEUE)
ch.close
conn.close
raise "got #{got.inspect}" unless got == BODIES
