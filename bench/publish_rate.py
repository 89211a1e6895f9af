"""How fast one process publishes with confirms to a job-like queue, with or without a
consumer on it (the relay's path without coldbrew: aio-pika only, no PostgreSQL).

Issue #15's relay drain (~950 jobs/s) matched this probe's rate for one channel
with a consumer attached; see bench/README "bench/publish_rate.py".
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid

import aio_pika
import uvloop

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
QUEUE_ARGUMENTS = {"x-max-priority": 10}
BODY = b'{"type": "noop", "args": {}}'


async def consume(name: str, count: int) -> None:
    """Ack each message at once until ``count`` were seen (run in its own process)."""
    connection = await aio_pika.connect_robust(AMQP_URL)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=200)
        queue = await channel.declare_queue(name, durable=True, arguments=QUEUE_ARGUMENTS)
        seen = 0
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal seen
            await message.ack()
            seen += 1
            if seen >= count:
                done.set()

        await queue.consume(on_message)
        await asyncio.wait_for(done.wait(), 120)


async def publish(count: int, channels: int, window: int, with_consumer: bool) -> float:
    """Publish ``count`` persistent messages over ``channels`` channels; return msg/s."""
    name = f"bench_publish_rate_{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect_robust(AMQP_URL)
    async with connection:
        lanes = [await connection.channel(publisher_confirms=True) for _ in range(channels)]
        queue = await lanes[0].declare_queue(name, durable=True, arguments=QUEUE_ARGUMENTS)
        consumer = None
        if with_consumer:
            consumer = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--consume", name, "--jobs", str(count)
            )
            await asyncio.sleep(1.5)  # its consumer is on the queue before the first publish
        limit = asyncio.Semaphore(window)

        async def one(index: int) -> None:
            message = aio_pika.Message(
                BODY, message_id=str(index), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            )
            async with limit:
                exchange = lanes[index % channels].default_exchange
                await exchange.publish(message, routing_key=name, timeout=60)

        started = time.perf_counter()
        await asyncio.gather(*(one(index) for index in range(count)))
        rate = count / (time.perf_counter() - started)
        if consumer is not None:
            await consumer.wait()
        await queue.delete(if_unused=False, if_empty=False)
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--channels", type=int, default=1, help="confirming channels")
    parser.add_argument("--window", type=int, default=256, help="publishes in flight")
    parser.add_argument("--with-consumer", action="store_true", help="a consumer process acks")
    parser.add_argument("--consume", metavar="QUEUE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consume:
        uvloop.run(consume(args.consume, args.jobs))
        return 0
    rate = uvloop.run(publish(args.jobs, args.channels, args.window, args.with_consumer))
    print(
        f"{args.jobs} publishes, {args.channels} channel(s), window {args.window}, "
        f"consumer {'on' if args.with_consumer else 'off'}: {rate:,.0f} msg/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
