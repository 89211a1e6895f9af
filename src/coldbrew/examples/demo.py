"""The demo app: a video pipeline with I/O-bound and CPU-bound jobs.

``thumbnail`` and ``notify`` are coroutines (event loop); ``transcode`` is a
plain function (process pool). ``notify`` fails once to show a retry, and
``ingest`` rejects bad input permanently.
"""

from __future__ import annotations

import asyncio
import hashlib

from coldbrew import App, Context, Permanent

app = App()


@app.job()
async def thumbnail(ctx: Context, video_id: str, size: int = 256) -> dict[str, object]:
    """Render a thumbnail (simulated I/O), reporting progress per step."""
    for step in range(1, 5):
        await asyncio.sleep(0.25)
        ctx.progress(step / 4, f"rendering {step}/4")
    return {"video_id": video_id, "url": f"s3://thumbs/{video_id}-{size}.jpg"}


@app.job(queue="slow", timeout=600)
def transcode(ctx: Context, video_id: str, resolutions: list[str]) -> dict[str, object]:
    """Encode each resolution (real CPU work in the process pool)."""
    digests = {}
    for index, resolution in enumerate(resolutions, start=1):
        ctx.progress((index - 1) / len(resolutions), f"encoding {resolution}")
        digest = hashlib.sha256(video_id.encode())
        for _ in range(120_000):
            digest = hashlib.sha256(digest.digest())
        digests[resolution] = digest.hexdigest()[:12]
    ctx.progress(1.0, "done")
    return {"video_id": video_id, "renditions": digests}


@app.job(max_attempts=4)
async def notify(ctx: Context, user: str, message: str) -> dict[str, object]:
    """Send a notification; the first attempt fails like a flaky network would."""
    if ctx.attempt == 1:
        raise ConnectionError("connection reset by peer (simulated)")
    sent = await ctx.once("send")  # never sends twice, even if retried after this line
    await asyncio.sleep(0.1)
    return {"user": user, "sent": sent, "message": message}


@app.job()
async def ingest(ctx: Context, size_bytes: int) -> dict[str, object]:
    """Accept an upload; an oversize one fails permanently, without retries."""
    if size_bytes > 1_000_000_000:
        raise Permanent(f"upload of {size_bytes} bytes exceeds the 1 GB limit")
    await asyncio.sleep(0.1)
    return {"accepted": size_bytes}
