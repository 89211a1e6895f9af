"""Flow values (pure) and coldbrew.testing.run_inline, which needs no services."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from coldbrew import App, Context
from coldbrew.errors import InvalidArguments
from coldbrew.flow import Step, chain, chain_step_id, child_job_id, step
from coldbrew.model import children_summary
from coldbrew.testing import run_inline

app = App()


@app.job()
async def parent(ctx: Context, count: int) -> int:
    for n in range(count):
        await ctx.submit("child", {"n": n}, name=f"c{n}", priority=3)
    await ctx.submit("child", {"n": 0}, name="c0")  # the same name again: replaces it
    ctx.progress(0.5, "half")
    return count


@app.job()
async def child(ctx: Context, n: int) -> int:
    return n


@app.job()
def pooled(ctx: Any, n: int) -> str:
    ctx.progress(1.0)
    return ctx.submit("child", {"n": n}, name="only")


@app.job()
async def checkpointer(ctx: Context) -> None:
    await ctx.checkpoint({"at": 1})


def test_child_ids_are_derived_from_parent_and_name() -> None:
    first = child_job_id("job-1", "thumb")
    assert first == child_job_id("job-1", "thumb")  # every attempt names the same child
    assert uuid.UUID(first).version == 5
    assert len({first, child_job_id("job-1", "thumb2"), child_job_id("job-2", "thumb")}) == 3
    assert child_job_id("a", "b\x00c") != child_job_id("a\x00b", "c")  # no ambiguity
    assert chain_step_id("c", 0) != chain_step_id("c", 1) != child_job_id("c", "1")


def test_chain_takes_steps_pairs_and_types_and_refuses_bad_ones() -> None:
    built = chain(step("a", {"x": 1}), ("b", {"y": 2}), "c", tenant="acme", chain_id="c1")
    assert [s.type for s in built.steps] == ["a", "b", "c"]
    assert built.steps[1] == Step("b", {"y": 2})
    assert (built.tenant, built.chain_id) == ("acme", "c1")
    with pytest.raises(ValueError, match="at least one step"):
        chain()
    with pytest.raises(ValueError, match="receive the previous result"):
        chain("a", step("b", {"previous": 1}))
    assert chain("a", step("b", {"previous": 1}, result_arg="before")).steps[1].args
    with pytest.raises(TypeError, match="a chain step"):
        chain(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most"):
        chain(*["a"] * 101)


def test_children_summary_counts_by_status() -> None:
    assert children_summary(None) == {"total": 0, "by_status": {}}
    assert children_summary({"running": 1, "succeeded": 2}) == {
        "total": 3,
        "by_status": {"running": 1, "succeeded": 2},
    }


async def test_run_inline_collects_children_and_progress() -> None:
    run = await run_inline(app, "parent", {"count": 2}, job_id="p1", tenant="acme")
    assert run.result == 2
    assert run.progress == [(0.5, "half")]
    assert [(c.id, c.type, c.args, c.tenant) for c in run.children] == [
        (child_job_id("p1", "c0"), "child", {"n": 0}, "acme"),
        (child_job_id("p1", "c1"), "child", {"n": 1}, "acme"),
    ]
    assert run.children[1].priority == 3
    assert run.children[0].priority == 0  # replaced by the second submit of "c0"


async def test_run_inline_runs_plain_function_jobs_in_a_thread() -> None:
    run = await run_inline(app, "pooled", {"n": 4}, job_id="p2")
    assert run.result == child_job_id("p2", "only")
    assert [c.args for c in run.children] == [{"n": 4}]


async def test_run_inline_checks_args_and_children() -> None:
    with pytest.raises(InvalidArguments):
        await run_inline(app, "parent", {"count": "many"})
    with pytest.raises(InvalidArguments):
        await run_inline(app, "parent", {})  # count is required


async def test_run_inline_without_a_store_says_what_is_missing() -> None:
    with pytest.raises(RuntimeError, match="no job store"):
        await run_inline(app, "checkpointer")
