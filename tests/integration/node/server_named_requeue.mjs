// rabbitmq-client consuming a server-named queue, which it names "" in
// basic.consume (the channel's last declared queue): the first delivery is
// requeued (ConsumerStatus.REQUEUE), the second acked. Prints one JSON
// line: the queue's name and each delivery's redelivered flag, rebound
// count header and arrival time. Exits 1 when the message does not come
// back within 20 s.
// Usage: node server_named_requeue.mjs AMQP_URL
import {Connection, ConsumerStatus} from 'rabbitmq-client'

const rabbit = new Connection({url: process.argv[2], retryLow: 100,
                               retryHigh: 500})
const seen = []
let finish
const done = new Promise((resolve) => { finish = resolve })
const sub = rabbit.createConsumer({
  queue: '',
  queueOptions: {exclusive: true},
  qos: {prefetchCount: 1},
}, async (msg) => {
  seen.push({redelivered: msg.redelivered,
             count: (msg.headers || {})['rebound-retry-count'] ?? null,
             t: Date.now()})
  if (seen.length === 1)
    return ConsumerStatus.REQUEUE
  finish(true)
  return ConsumerStatus.ACK
})
sub.on('error', (err) => { console.error('consumer error', err) })
await new Promise((resolve) => sub.once('ready', resolve))
const pub = rabbit.createPublisher({confirm: true})
await pub.send({routingKey: sub.queue}, 'm')
const timer = setTimeout(() => finish(false), 20000)
const ok = await done
clearTimeout(timer)
console.log(JSON.stringify({queue: sub.queue, deliveries: seen}))
await pub.close()
await sub.close()
await rabbit.close()
process.exit(ok ? 0 : 1)
