"""`RayRunner`: child runs on a Ray cluster's async actors.

The parent sends each child run as a frozen `RayJob` (agent name, link, State id, task, store
URL, deadline, the parent call's trace context) to one of a few async actors (`ChildWorker`).
The worker opens the store by URL (`stores.open_store`, once per URL), rebuilds its agents from
the registry (a module the user names, once per URL), runs
``await agent.arun(state, link=job.link)`` under the parent call's span (`traced_under`), and
the child is saved in the shared store. The parent then loads the child from its own store:
answer, usage and history are the ones the worker saved.

Guarantees, as for a child run here:
- cancelling the parent cancels the actor task: the child records ``interrupted`` and is saved
  before the parent's call returns (waited for, shielded, `cancel_grace` seconds at most);
- a worker that dies is never retried (every Ray retry and restart is 0): the parent loads the
  child (its open calls closed ``unknown``), saves it, and its call gets a `ChildRunError`
  naming the child; the next child gets a new actor;
- a parent process that dies takes its actors with it (Ray's owner fate-sharing): its children
  stop, and running the parent again continues them from the store;
- a child spends against the limits above it as it saves (the parent follows the store's tree
  feed), and the cancellation above stops it once they are used up.

Ray is imported when the first child is sent, never at import: ``pip install 'orchestrator[ray]'``.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from .._base._errors import ChildRunError, error_text
from .._base._limits import Limits
from .._base._link import Link
from .._record._state import State, bind_state
from .._record._store_client import AnyStore, StoreClient, client_of
from .._running._runner import ChildJob

__all__ = ("ChildWorker", "RayJob", "RayRunner", "load_registry", "traced_under")

_INSTALL = "pip install 'orchestrator[ray]'"


@dataclass(frozen=True, slots=True, kw_only=True)
class RayJob:
    """What travels to a worker: plain values only (the agent goes by name).

    Attributes:
        agent: The name of the agent in the registry.
        link: The parent State and tool call the child hangs under.
        state_id: The child State's id.
        task: The task of a new child; None continues the stored State.
        store_url: The URL of the shared store (`stores.open_store`); it may hold a password,
            so the repr leaves it out.
        deadline: When the child must stop (`time.time()` seconds), or None.
        trace_context: The W3C trace context of the parent call's span (`ChildJob`'s), or
            empty: the worker runs the child under it, so its spans join the parent's trace.
        limits: The child's limits: its tool's slice and what was left of the limits above
            it when it started (the tighter of each), or None.
    """

    agent: str
    link: Link
    state_id: str
    task: str | None
    store_url: str = field(repr=False)
    deadline: float | None
    trace_context: Mapping[str, str] = field(default_factory=dict[str, str])
    limits: Limits | None = None

    @classmethod
    def of(cls, job: ChildJob) -> RayJob:
        """The plain values of `job` that a worker needs (its store must have a URL)."""
        return cls(
            agent=cast("str", job.agent.name),
            link=job.link,
            state_id=job.state_id,
            task=job.task,
            store_url=cast("str", _shared(job).url),
            deadline=job.deadline,
            trace_context=dict(job.trace_context),
            limits=job.remaining if job.limits is None else job.limits.tighter(job.remaining),
        )


def _shared(job: ChildJob) -> StoreClient:
    """The client of the job's store, which the workers open by its URL.

    Raises:
        ValueError: The store has no URL (or there is none): the message says what to give.
    """
    client = None if job.store is None else client_of(job.store)
    if client is None or not client.url:
        raise ValueError(
            f"RayRunner cannot send the child of call {job.link.call_id!r}: its store"
            f" ({job.store!r}) has no URL the workers can open. Give the parent agent a"
            " store both sides reach by URL: PostgresStore(dsn), SQLiteStore(path) on a"
            " shared disk, or stores.open_store(url)."
        )
    return client


def load_registry(registry: str, store: AnyStore | None) -> dict[str, Any]:
    """The agents of `registry` (``"module"`` or ``"module:function"``), by name.

    The function (``agents`` unless named) takes the store and returns the agents, each with
    a name: ``def agents(store): return [Agent(..., name="researcher", store=store)]``.

    Raises:
        ImportError: The module cannot be imported.
        TypeError, ValueError: The function is missing, or returns something else than
            named Agents.
    """
    from .._running._agent import Agent

    module_name, _, function_name = registry.partition(":")
    module = importlib.import_module(module_name)
    function_name = function_name or "agents"
    build = getattr(module, function_name, None)
    if not callable(build):
        raise TypeError(
            f"The registry {registry!r} has no function {function_name!r}: define"
            f" `def {function_name}(store)` in {module_name} returning the agents."
        )
    built = cast("Callable[[Any], Any]", build)(store)
    items: Any = cast("Mapping[str, Any]", built).values() if isinstance(built, Mapping) else built
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise TypeError(f"The registry {registry!r} must return a list of Agents, got {built!r}.")
    agents: dict[str, Any] = {}
    for item in cast("Iterable[Any]", items):
        if not isinstance(item, Agent) or not item.name:
            raise ValueError(
                f"The registry {registry!r} returned {item!r}: each item must be an Agent with"
                " a name (it is found by that name)."
            )
        agents[item.name] = item
    return agents


class ChildWorker:
    """The body of a Ray async actor: runs child runs on this worker (many at once)."""

    def __init__(self, registry: str) -> None:
        self._registry = registry
        self._opened: dict[str, tuple[AnyStore, dict[str, Any]]] = {}  # by URL: store, agents

    def _open(self, url: str) -> tuple[AnyStore, dict[str, Any]]:
        opened = self._opened.get(url)
        if opened is None:
            from stores import open_store

            store = open_store(url)
            opened = self._opened[url] = (store, load_registry(self._registry, store))
        return opened

    async def run(self, job: RayJob) -> str | None:
        """Run `job`'s child to its end; None when it ran, else why it failed (text).

        A cancellation (the parent's) is recorded by the child and re-raised.
        """
        store, agents = self._open(job.store_url)
        agent = agents[job.agent]
        child = ChildJob(
            agent=agent,
            link=job.link,
            state_id=job.state_id,
            task=job.task,
            store=store,
            deadline=job.deadline,
        )
        state = await child.open_state()
        if job.task is not None and agent.store is None:
            bind_state(state, store)  # the run saves it in the shared store (no write before)
        left = None if job.deadline is None else job.deadline - time.time()
        try:
            with (
                traced_under(job.trace_context),
                anyio.move_on_after(left if left is None or left > 0 else 0),
            ):
                await agent.arun(state, link=job.link, limits=job.limits)
        except Exception as error:  # recorded in the child and saved; the parent reads it
            return error_text(error)
        return None

    def ping(self) -> bool:
        """Whether the worker is up (used to wait for it)."""
        return True


class RayRunner:
    """Runs child runs on a Ray cluster (async actors); the default is `LocalRunner`.

    Args:
        registry: The module that rebuilds the agents on a worker: ``"myapp.agents"``
            (its ``agents(store)`` function) or ``"myapp.agents:build"``. The parent loads it
            too, to refuse an unknown agent before anything is sent.
        actors: How many async actors share the children (each runs many at once).
        address: The cluster to join (``"auto"``, ``"ray://host:10001"``); None joins the
            one `ray.init` already joined, or starts a local one.
        cancel_grace: Seconds a cancelled parent waits for its remote children to record
            ``interrupted`` and be saved.

    The parent's store must have a URL (`store.url`: `SQLiteStore`, `FileStore`,
    `PostgresStore` from a DSN, or `stores.open_store(url)`) that the workers can open.

    Raises:
        TypeError, ValueError: A bad argument.
    """

    def __init__(
        self,
        registry: str,
        *,
        actors: int = 2,
        address: str | None = None,
        cancel_grace: float = 30.0,
    ) -> None:
        if not isinstance(registry, str) or not registry.partition(":")[0]:
            raise TypeError(
                f"registry must name a module, e.g. 'myapp.agents' or 'myapp.agents:build',"
                f" got {registry!r}."
            )
        if isinstance(actors, bool) or not isinstance(actors, int) or actors < 1:
            raise ValueError(f"actors must be an int >= 1, got {actors!r}.")
        if isinstance(cancel_grace, bool) or not isinstance(cancel_grace, int | float):
            raise TypeError(f"cancel_grace must be a number of seconds, got {cancel_grace!r}.")
        self.registry: str = registry
        self.actors: int = actors
        self.address: str | None = address
        self.cancel_grace: float = float(cancel_grace)
        self._names: frozenset[str] | None = None
        self._lock = threading.Lock()  # the pool is used from any event loop or thread
        self._pool: list[Any] = []  # actor handles
        self._load: list[int] = []  # children running on each
        self._next = 0

    def __repr__(self) -> str:
        return f"RayRunner({self.registry!r}, actors={self.actors})"

    # -- before anything is sent -----------------------------------------------------------------

    def check(self, job: ChildJob) -> None:
        """Refuse a job a worker could not run: no store URL, or an agent not in the registry.

        Raises:
            ValueError: The message says what to change.
        """
        _shared(job)
        name = job.agent.name
        names = self._registry_names(job.store)
        if name not in names:
            known = ", ".join(sorted(names)) or "none"
            raise ValueError(
                f"RayRunner's registry {self.registry!r} has no agent {name!r} (it has:"
                f" {known}): add it to the registry, so the workers can rebuild it by name."
            )

    def _registry_names(self, store: AnyStore | None) -> frozenset[str]:
        if self._names is None:
            self._names = frozenset(load_registry(self.registry, store))
        return self._names

    # -- sending ---------------------------------------------------------------------------------

    async def run(self, job: ChildJob) -> State:
        """Run the job's child on an actor; return the child as it was saved.

        Raises:
            ChildRunError: The child failed on the worker, or its worker died.
        """
        self.check(job)
        ray = _ray()
        remote = RayJob.of(job)
        if not ray.is_initialized():
            address = self.address
            await anyio.to_thread.run_sync(
                lambda: ray.init(address=address, configure_logging=False)  # the app's logging
            )
        slot, actor = self._take(ray)
        failed: str | None = None
        try:
            ref = actor.run.remote(remote)
            try:
                failed = await _result(ref)
            except anyio.get_cancelled_exc_class():
                ray.cancel(ref)
                with anyio.move_on_after(self.cancel_grace, shield=True):
                    await _settled(ref)  # the child records `interrupted` and is saved
                raise
            except ray.exceptions.RayActorError as error:
                self._drop(actor)
                with anyio.CancelScope(shield=True):
                    raise await self._lost(job, error) from error
        finally:
            self._give_back(slot)
        state = await _shared(job).load(job.state_id)
        if failed is not None:
            raise ChildRunError(
                f"The child State {job.state_id} failed on its Ray worker: {failed}",
                state_id=job.state_id,
                state=state,
            )
        return state

    async def _lost(self, job: ChildJob, error: BaseException) -> ChildRunError:
        """The error of a child whose worker died: the child loaded and saved, never re-run."""
        state: State | None = None
        try:
            client = _shared(job)
            state = await client.load(job.state_id)  # open calls closed `unknown`
            await client.save(state)
        except LookupError:
            pass  # it died before the child's first save
        what = type(error).__name__
        kept = (
            "nothing of it was saved, since it died before the child's first save"
            if state is None
            else "it was saved as far as it got, its open calls closed 'unknown'. Inspect it"
            " with state.child(id)"
        )
        return ChildRunError(
            f"The Ray worker running the child State {job.state_id} died ({what}); the child"
            f" is not run again: {kept}.",
            state_id=job.state_id,
            state=state,
        )

    def _take(self, ray: Any) -> tuple[int, Any]:
        """The least busy actor (made when missing), counted busy until `_give_back`."""
        with self._lock:
            while len(self._pool) < self.actors:
                self._pool.append(_new_actor(ray, self.registry))
                self._load.append(0)
            slot = min(range(len(self._pool)), key=self._load.__getitem__)
            self._load[slot] += 1
            return slot, self._pool[slot]

    def _give_back(self, slot: int) -> None:
        with self._lock:
            if slot < len(self._load) and self._load[slot] > 0:
                self._load[slot] -= 1

    def _drop(self, actor: Any) -> None:
        """Forget a dead actor: the next child gets a new one in its place."""
        with self._lock:
            for index, known in enumerate(self._pool):
                if known is actor:
                    self._pool[index] = _new_actor(_ray(), self.registry)

    def shutdown(self) -> None:
        """Stop this runner's actors (their running children stop with them)."""
        ray = _ray()
        with self._lock:
            pool, self._pool, self._load = self._pool, [], []
        for actor in pool:
            ray.kill(actor, no_restart=True)


@contextlib.contextmanager
def traced_under(trace_context: Mapping[str, str]) -> Generator[None]:
    """Make the span `trace_context` names (W3C, from a parent elsewhere) the current parent.

    Inside, a run's `OtelReporter` (and any OpenTelemetry instrumentation) starts its spans
    under it, in the parent's trace: `opentelemetry.propagate.extract`, attached for the block.
    Without a context, or without OpenTelemetry installed here, it does nothing.
    """
    if not trace_context:
        yield
        return
    try:
        from opentelemetry import context, propagate
    except ImportError:  # pragma: no cover - no OpenTelemetry here: nothing traces the child
        yield
        return
    token = context.attach(propagate.extract(trace_context))
    try:
        yield
    finally:
        context.detach(token)


def _ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as error:
        raise ImportError(f"RayRunner needs Ray: {_INSTALL}") from error


def _new_actor(ray: Any, registry: str) -> Any:
    """A new async actor: never restarted, its tasks never retried."""
    worker = ray.remote(ChildWorker).options(
        max_restarts=0, max_task_retries=0, max_concurrency=1000, num_cpus=0
    )
    return worker.remote(registry)


async def _result(ref: Any) -> Any:
    """Wait for `ref` without blocking the event loop (asyncio or trio); its value or error."""
    future = ref.future()
    if not future.done():
        done = anyio.Event()
        token = anyio.lowlevel.current_token()
        loop_thread = threading.get_ident()

        def wake(_: Any) -> None:
            if threading.get_ident() == loop_thread:
                done.set()
                return
            with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody waits
                anyio.from_thread.run_sync(done.set, token=token)

        future.add_done_callback(wake)
        await done.wait()
    else:
        await anyio.lowlevel.checkpoint()
    return future.result()


async def _settled(ref: Any) -> None:
    """Wait until `ref` has ended, whatever its outcome."""
    with contextlib.suppress(Exception):  # cancelled, failed or lost: it ended
        await _result(ref)
