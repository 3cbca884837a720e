"""Ordered: shortest remaining prefill first with an aging bound; the step's budget,
admission limit and the aging clock all from the bound cost model.

Ours (issue 20). Real traffic mixes 100-token and 8k-token prompts in bursts; there the
order in which prompts are prefilled matters as much as the chunk size. Every step, from
one linearisation of the cost model (``ppas.cost.steps.StepCosts``, tabulated once):

1. **Order** (``prefill_order``). The pending prompts (running with prompt tokens left,
   and waiting) are sorted by *remaining uncached prefill tokens*, shortest first (SRPT
   on the prefill: LAPS / Sorted-F's seed), ties by arrival then id. A request is
   **overdue** once it has waited ``aging`` times its solo latency ``s_i``:
   ``now - arrival_i >= aging * s_i``. Overdue requests go ahead of every other one,
   first come first served among themselves.
   **The aging scale** (``solo=prefill``; ``e2e`` by default). ``s_i`` is the request's
   solo E2E: its prefill, then one decode step per further output. The order decides
   only when a prompt's prefill starts, and the outputs it reads are the request's
   ``max_tokens`` (in vLLM a cap, not a length), so a request with many outputs (or a
   generous cap) gets a deadline scaled by decode time it would spend whatever the order:
   on the Azure code trace with every output 10x longer, P99 TTFT rose to 1.61x the best
   stock setting's (``docs/results/real-traffic.md``, "An output-heavy shape"). With
   ``solo=prefill``, ``s_i`` is the prefill alone (the same steps, no decode term), so
   the deadline is in units of the service the order controls; the aging bound below holds
   with that ``s_i``. Off by default: on that shape it cut the TTFT tail to 1.30x but gave
   back the ordering gain (mean E2E up to 1.15x the stock setting's under overload), and
   on the two open traces it costs 0.1-3.2 points of gain.
   **The overdue prefix** (``overdue_prefix=true``; off by default). Under saturation
   something is nearly always overdue, and then a fresh request waits behind every
   overdue one until it is overdue itself, however long ago it arrived. With the option,
   once any pending prompt is overdue, let ``A`` be the newest overdue arrival: every
   pending prompt that arrived no later than ``A`` goes first, in arrival order (ties by
   id), then the rest shortest-first. Invariant: if any request is overdue, every request
   of arrival ``<= A`` precedes every later arrival, in (arrival, id) order; hence the
   aging bound below still holds with "arrived no later than ``i``" (the requests ahead
   of an overdue ``i`` need not be overdue themselves) (``tests/test_ordered.py``).
   **The drain floor** (``drain=D``; 1 by default, 0 turns it off). Under saturation every request
   has waited many times its solo latency, so all are overdue and the order is FCFS: the
   reordering gain is gone exactly where the queue is longest. With ``D > 0`` a request is
   overdue only once it has waited both ``aging * s_i`` and ``D * T(t)``, where ``T(t)``
   (``drain_floor``) is the time the pending prompts take to prefill alone: about what a
   request arriving now waits for its first chunk under FCFS. So nobody is passed by a
   later arrival once it has waited ``D`` times what a newcomer would wait under FCFS,
   and the longest waits, which set P99 TTFT, stay near FCFS's while short prompts go
   first. ``T(t)`` is read off the view at each step (no state), so the bound below
   holds with ``max(aging * s_i, D * T(t))`` at each step ``t``: a backlog that grows
   faster than ``1 / D`` seconds per second can keep a request fresh while it lasts
   (under such overload FCFS's waits grow as fast). With ``D = 0`` the floor is 0 and
   the decisions are those without it, bit for bit. Both decision paths compute the
   same floor (``drain_floor``; the index keeps the waiting requests' terms summed);
   with the overdue prefix as well, ``decide`` takes ``decide_full``.
   **The FCFS turn** (``turn=K``; 1 by default, 0 turns it off). The aging term and the
   drain floor count seconds, and under overload nearly every request soon passes both:
   the order is then FCFS among a crowd of overdue requests, the reordering gain goes,
   and a request with a long deadline of its own (many outputs, under ``solo=e2e``)
   waits behind that crowd (the Mooncake slice at 1.5x its rate on an H100: P99 TTFT
   1.32x the stock setting's, ``docs/results/real-traffic.md``). With ``K > 0`` a request
   is overdue only once it has also reached its *FCFS turn*
   (``ppas.policies.fcfs_turn``): the uncached prompt tokens admitted since it arrived
   reach ``K`` times those that were waiting when it arrived; with ``K = 1``, by then FCFS
   would have admitted it. So a request that no later arrival has set back never goes
   first by age (shortest-first keeps working under overload), and one that has been set
   back goes first once it is where FCFS would have admitted it, whatever its outputs.
   Counted in tokens admitted, the turn reads neither outputs nor step sizes nor how long
   the KV cache holds admissions back. ``K = 1`` is FCFS's own admission point, not a
   fitted value. The aging bound below holds with overdue meaning all three: the aging
   term, the drain floor and the turn. Invariant: with ``K = 0`` the decisions are those
   without it, bit for bit (``tests/test_fcfs_turn.py``, ``tests/test_ordered.py``).
2. **Budget** (``chunk``): the smallest candidate chunk ``c`` (powers of two in [c_min,
   c_max]) whose prefill throughput beside the running decodes, ``c / (S(c) + decodes'
   cost per step)``, reaches ``efficiency`` times the biggest chunk's: past that knee a
   bigger chunk buys little prefill throughput and stretches every riding decode's step
   (and, with no decode running, lumps more first tokens into one long step). More
   decodes riding (a larger fixed cost per step) move the knee to bigger chunks. With
   the default ``c_max`` of 4096 the knee is ``c_max`` on an H100 with an 8B model (the
   budget is then 4096 at every step); with ``c_max`` 8192 it reaches 8192 under many
   decodes there, which raised P99 TPOT at 3x load for no gain in mean E2E
   (``docs/results/real-traffic.md``).
   **Saturation** (``saturation_chunk``, on by default): the knee weighs a chunk's cost
   to the riding decodes only; when the pending prompts outrun what the knee clears,
   throughput rules instead, and the budget grows from the knee towards the most
   throughput-efficient chunk, up to ``c_max`` while any decode rides and up to
   ``c_sat`` in a step with none (the TPOT bound: a riding decode never sees a step
   longer than the knee rule's worst, a ``c_max`` chunk beside it). ``c_sat`` defaults
   to ``c_max``: in our runs (``docs/results/real-traffic.md``) growing past ``c_max``
   beside decodes raised P99 TPOT 1.8x for < 1% of mean E2E, decode-free steps past it
   changed nothing measurable under saturation (there decodes nearly always ride), and
   the larger global MBT it needs reserves activation memory out of the KV cache. Among
   the candidate chunks ``c`` in [knee, ceiling] (those on the efficiency frontier: each
   one clears strictly more prefill tokens per second than every smaller one), the budget
   minimises the latency the next drain costs everyone in the engine, from the bound
   StepCosts:

       J(c) = t(c) * (L + Q / c + (N - 1) / 2),

   ``t(c)`` = a step of ``c`` tokens beside the running decodes, at the causal pairs per
   token of the first ``ceiling`` tokens of the order (counted from the pending prompts'
   contexts: over those tokens every candidate does the same attention work, however it
   cuts them, so a smaller chunk is not credited with a long prompt's low-context head);
   ``L`` = the outputs the running decodes have left (each waits ``t(c)`` per token);
   ``Q`` = sum over the ``N`` pending prompts of the prompt tokens queued up to and
   including each one in this order (prompt ``i`` finishes its prefill after
   ``C_i / c`` steps of ``t(c)``), plus half a step for each prompt but the last, the step
   quantisation (a prompt's last token lands anywhere in its last step, which runs on
   with the next prompt's tokens: the 1/2 is the mean of a uniform position, not a fitted
   factor; the last prompt's step ends with it, and a partial step is priced at its own
   tokens). No threshold is fitted: a small backlog (``Q / c``
   small against ``L``) keeps the knee, a backlog that outruns it (``Q`` growing as the
   square of the queued tokens) moves the argmin to the frontier's top. For fixed ``L``
   and ``N`` the choice is monotone in ``Q`` (``J``'s increase per unit ``Q``,
   ``t(c) / c``, falls along the frontier); the budget is never below the floor (below)
   nor above the global MBT (``max(c_max, c_sat)``). Cost: one pass over the running
   requests and a prefix of the order, stopped as soon as the frontier's top is the
   argmin and every further prompt can only favour it (queued tokens past ``C*``,
   ``saturation_chunk``), or at the first prompt the KV cache cannot take (below).
   Two rules make ``J`` weigh the riding decodes as the engine will serve them (both on
   by default; ``ride_floor=true,kv_backlog=false`` is the rule before them):

   * **The idle floor** (``ride_floor=false``). Beside running decodes the candidates
     start at the *idle knee*, the knee of a decode-free step (``chunk(0, 0)``), not at
     the knee with the decodes' cost per step counted. That knee grows with the decodes
     riding (their fixed cost is amortised over a bigger chunk), which is what prefill
     throughput wants and the opposite of what the decodes want: each of them waits a
     whole step per token. ``J`` already prices both (``L t(c)`` for the decodes,
     ``Q t(c) / c`` for the queue), so it, not the throughput knee, decides whether the
     decodes' steps grow past the idle knee. Invariant: beside decodes,
     ``min(idle knee, knee) <= budget <= c_max``, and the budget is ``J``'s argmin over
     that range; without decodes nothing changes. On an H100 with an 8B model the idle
     knee is ``c_max`` and nothing changes at all.
   * **The admissible backlog** (``kv_backlog=true``). ``Q`` and ``N`` count the
     running prompts and the waiting prompts in the engine's order up to the first whose
     footprint (prompt + outputs) does not fit in the KV room left beside the running
     requests and the prompts before it (rule 3's walk). A prompt that cannot be
     admitted now is not served by this step's budget whatever its size; counting it made
     a KV-bound engine (a long-context backlog, e.g. the Mooncake slice on an A100) take
     the biggest chunk and double every riding decode's step for prefill it could not
     start. Invariant: the budget is the same as with the waiting queue cut before that
     first prompt (``tests/test_ordered.py``).
   * **The drain's length** (``ride_drain=true``; off by default). ``L`` charges a riding
     decode ``t(c)`` for every output it has left, as if every one of them rode a step of
     the drain. The drain of the ``queued`` tokens lasts ``S(c) = queued / m`` steps; a
     decode with ``r`` outputs left rides ``min(r, S(c))`` of them, and its later tokens
     are decode steps whatever ``c`` was. With the option ``L`` becomes
     ``sum_i min(r_i, S(c))``: a bigger chunk's drain is shorter, so long-running decodes
     no longer hold the budget at the knee behind a backlog the bigger chunk clears
     sooner. Invariant: the budget is never smaller than without the option, and equal
     when the drain outlasts every riding decode (``S(c_top) >= max r_i``)
     (``tests/test_ordered.py``). Off by default: with ``c_max=8192`` it meets every
     latency bar on the Mooncake slice with an H100, where the knee's 4096-token steps
     kept the longest prompts waiting, but on the Azure trace and on the A100 it raises
     P99 TPOT 1.3-1.95x over the stock settings' (``docs/results/real-traffic.md``, "The
     drain's length"). Its stopping rule is the whole admissible backlog (no early exit).
   * **The riding knee** (``ride_ceiling=true``, with ``c_sat > c_max``; off by default).
     Beside running decodes the ceiling is ``c_max``, whatever they cost. With the option
     it is the bigger of ``c_max`` and the knee over the saturation candidates ``[c_min,
     c_sat]`` with the decodes' cost per step counted (``_knee``, the same rule and
     ``efficiency`` as the budget's knee): a step grows past ``c_max`` beside decodes only
     where a ``c_max`` chunk clears less than ``efficiency`` of the biggest chunk's
     prefill per second, i.e. where the decodes' fixed cost (many of them, or long
     contexts) is what a bigger chunk amortises. On an H100 with an 8B model that tells
     the two open traces apart: beside 36 decodes at 1.5k tokens of context (the Azure
     code trace) the knee is 4096, beside 36 at 8k (the Mooncake slice) it is 8192.
     Invariant: beside decodes the budget is at most ``max(c_max, riding knee)``; without
     decodes nothing changes (``tests/test_ordered.py``). The config refuses the option
     without ``saturation`` and ``c_sat > c_max``, where it could change nothing.
     Off by default: with ``c_sat=8192,ride_drain=true`` it keeps the Azure trace's P99
     TPOT within 1.05x on both GPUs, where ``c_max=8192`` raised it 1.8-1.95x, but the
     drain's length then raises the Mooncake slice's on the A100 (whose stock setting runs
     2048-token steps) to 1.27x, and Mooncake / H100's P99 TTFT is still 1.13x
     (``docs/results/real-traffic.md``, "The riding knee"). Without the drain's length
     (with the drain floor at 0.75 and the gated idle limit) it meets 23 of the 24 bars:
     Mooncake / H100's P99 TTFT is then 1.32x ("The riding knee without the drain's
     length").
   **The idle limit** (``idle_limit=L``; ``-1``, from the cost model, by default; 0:
   off). vLLM serves running
   requests before it admits waiting ones, so a prompt that arrives while a long one is
   being prefilled waits for every chunk of it, whatever the order says; and a short
   prompt's first token waits at least for the step in flight. Under an SLO relative to
   the solo latency (TTFT <= 5x solo: 70 ms for a 20-token prompt on an H100 with an 8B
   model, a third of one 4096-token step) that is what sets the capacity on long-context
   traffic (``benchmarks/slo_misses.py``: on the Mooncake slice at low load nine in ten
   misses are prompts under 2k tokens, scheduled 0.25-0.8 s after they arrived). With
   ``L > 0``, while at most one request waits (no backlog, where chunk efficiency is not
   what the latency depends on) every chunk of the step is at most ``L`` tokens
   (``Decision.chunk_limit``: vLLM's ``long_prefill_token_threshold`` decided per step),
   so steps stay short and a long prompt leaves the budget's rest to the prompts behind
   it. With a backlog the decision is unchanged. Invariant: every prefill chunk of a step
   taken with one waiting request or none is at most ``L`` tokens; the decision is
   otherwise the one with ``L = 0`` (``tests/test_ordered.py``). Ungated it reaches the
   capacity bar on the Mooncake slice but costs mean E2E at 1x on the H100
   (``docs/results/real-traffic.md``, "Why capacity misses on the Mooncake slice"); behind
   the load gate (below) it keeps the capacity (1.38-2.74x the best stock setting's on the
   four pairs measured, against 0.92-1.78x without the limit) and changes mean E2E by
   -1.9% to +1.1% per load ("The gated idle limit by default"); on by default.
   **The limit from the cost model** (``idle_limit=-1``, the default;
   ``idle_limit_of``). ``L`` is the biggest candidate chunk (the powers of two in
   [c_min, c_max]) whose decode-free step costs at most twice a one-token step: its
   prefill at most the step's fixed part (host overhead, weight reads). A prompt that
   arrives mid-step then waits for at most one such step, twice the shortest step the
   engine runs, before its own chunk is scheduled. It is at least ``c_min`` (the smallest
   chunk the budget considers), and 0 (off) where it reaches the global MBT, where the
   limit cannot bind (a small model, whose steps are all short), or without a cost
   model. ``2`` is the point where the prefill work equals the fixed cost (the chunk's
   prefill throughput half the asymptote), not a fitted value. On an H100 with Qwen3-8B
   and on an A100 with Qwen2.5-7B it is 512 (on the A100 ``c_min``: a 512-token step
   there costs 2.6 one-token steps); so is it on this repository's CPU.
   **The load gate** (``idle_util=U``, with the idle limit; 0.5 by default, 0: no gate). A short
   queue is seen at low and at high load alike; what tells them apart is the arrival rate
   against what the limited engine can serve. The policy notes every request once, when
   it first sees it pending, with the time its prompt takes to prefill alone in chunks of
   ``L`` (``StepCosts.prefill_time``: the limited engine's work for it, attention over
   the prompt's own context included), and keeps the sum over the arrivals of the last
   ``idle_window`` seconds (``_ArrivalWork``). Their share of that window,
   ``rho_L = work / window``, is the utilisation an engine prefilling every prompt in
   ``L``-token chunks would have; the limit applies only while ``rho_L < U`` (and at most
   one request waits). ``U = 0.5`` is the natural bound, not a fitted value: an engine
   busy half the time makes a newcomer wait, on average, no longer than its own service
   (an M/M/1 queue's wait over service is ``rho / (1 - rho)``), so the slower chunks
   cannot build a queue that outweighs the short first steps they buy. Invariant: a step
   has ``chunk_limit = L`` exactly when at most one request waits and ``rho_L < U``;
   otherwise the decision is the one with ``L = 0`` (``tests/test_ordered.py``).
3. **Admission limit**, applied through the budget (as ``predictive.limit_budget``):
   with ``kv_ratio > 0`` (default 0: off), at most ``limit`` requests run at once, the
   decode batch whose KV reads per step reach ``kv_ratio`` times the weight reads
   (``dec_base = kv_ratio * limit * (dec_alone + dec_kv * mean running context)``): past
   it a bigger decode batch barely raises decode throughput. Off by default: in our
   trials it changed nothing on the Azure trace and lost mean E2E on the Mooncake slice
   (long contexts make the limit small). The budget is always capped so that only
   waiting requests the KV cache can hold (prompt + outputs) to their last output beside
   the running ones are admitted (``predictive.kv_admission_cap``'s rule, walked in this
   order; ``ppas.policies.kv_room``).
   **The footprint rule** (``kv_footprint``; on by default). That cap reserves every
   output a request may produce, read from its ``max_tokens``, before it is admitted;
   vLLM itself admits a prompt once its blocks fit and preempts (recomputes) decodes that
   outgrow the cache. With ``kv_footprint=false`` the walk checks no footprint and
   admission is the engine's; the saturation rule's admissible backlog (``kv_backlog``)
   still reads the footprints. On the two open traces the figures are the same on three
   pairs and within 0.3 points of gain on the fourth. On the Azure code trace with 10x
   outputs the rule held the engine to no preemption where stock ran 118, and FCFS at
   the stock step (``aging=0,c_max=2048,saturation=false``) lost 17% mean E2E at 2x to
   stock's ``mbt=2048`` with it (35.7 s against 30.4 s; without it 30.4 s, the stock
   figure) (``docs/results/real-traffic.md``, "An output-heavy shape"). Off, more
   decodes ride each step, so P99 TPOT rose there (1.20x to 1.32x the stock setting's);
   on by default.
   **By the future peak** (``kv_peak``; on by default, ``kv_peak=false`` is the rule
   before). The sum of whole footprints reserves every running decode's last output from
   now on, though a decode holds ``b + s`` tokens ``s`` steps from now and nothing once it
   has finished. The room is the future peak of KV use instead (``ppas.policies.kv_room``):
   a request is admitted iff, with it, the bounds on what every request holds at each
   future step (a decode: ``b + s`` until its last output; a prompt being prefilled:
   ``min(f, b + s)``, never finishing) stay within the capacity. Invariants: whatever the
   sum admits the peak admits; with exact lengths nothing admitted is ever preempted
   (``tests/test_kv_room.py``). The admissible backlog (rule 2) walks the same rule; with
   outputs estimated (rule 4) it stays the sum. On the two open traces (short outputs)
   the figures are the same on three pairs and within 0.2 points on Mooncake / H100. With
   10x outputs on an H100 it meets every bar on the Mooncake slice (+25.9% against
   +17.3%), and on the Azure trace cuts mean E2E 5.4% and 11.7% at 2x and 3x and the P99
   TTFT tail from 1.61x to 1.33x the stock setting's, while P99 TPOT rises from 1.20x to
   1.32x (more decodes ride each step) (``docs/results/real-traffic.md``, "The footprint
   rule by the future peak").
   **Shared blocks counted once** (prefix caching). Requests that share a prefix hold
   its blocks once, but a sum of footprints counts them once per request: with 40 agent
   sessions sharing a 2,000-token system prompt in a 48k-token cache the rule kept the
   queue waiting on room the engine had, 72.4% behind FCFS in mean E2E. The room now
   credits the tokens the running requests hold jointly (``SchedulerView.
   kv_shared_tokens``) and an admitted prompt's hit on blocks two of them hold, less
   what each decode that finishes by a point could take off them (``RequestView.
   num_shared_tokens``), so the bound stays an upper bound at every point
   (``ppas.policies.kv_room``, "Shared blocks"); on those sessions ``ordered`` is then
   13.9% ahead of FCFS, and 17-51% ahead on six other session shapes
   (``docs/results/prefix-caching.md``). Both engines count them: the simulator's pool
   and, in the plugin, vLLM's ``ref_cnt`` (``tests/test_differential.py``). Without
   prefix caching nothing is shared and the rule is the one above, bit for bit.
4. **Caps, not lengths** (``caps=observe``, the default; ``caps=lengths`` is the rule
   before it). Every rule above reads a request's outputs from ``max_output_tokens``,
   vLLM's ``max_tokens``: a cap. A replay with ``ignore_eos`` stops each request at its
   cap (every run measured above), but real clients send caps that most requests stop
   well before, and a client that sends none gets vLLM's default, ``max_model_len`` less
   the prompt. Read as lengths, such caps make every footprint the whole context (the
   footprint rule then admits a handful of requests at a time) and every aging deadline
   hours long: on the Azure code trace at twice its rate on an H100, mean E2E 5.88 s
   against 4.96 s for the stock setting and 3.17 s with exact caps
   (``docs/results/real-traffic.md``, "Real clients' max_tokens"). The engine records
   where its finished requests stopped (``OutputLengths``: the simulator, the vLLM
   plugin); once one has stopped before its cap, no rule reads a cap as a length, for the
   rest of the run:

   * the aging scale is the solo prefill (as ``solo=prefill``): the bound below holds
     with that ``s_i`` from then on;
   * admission is the engine's (as ``kv_footprint=false``);
   * the admissible backlog (rule 2) counts a request's outputs as the mean of the
     finished requests' (at most its cap; a running one's at least those it has, plus
     one): an estimate of the KV it will hold;
   * ``J``'s ``L`` still charges a riding decode every output its cap allows, so a long
     decode is priced as one. The decodes still running are the long ones (the short
     ones have finished), so an estimate from the finished requests undercharges them,
     and their steps grow; the cap keeps the Mooncake slice's P99 TPOT on an A100 at
     1.06x the stock setting's, as with exact caps.

   Invariant: while no request has stopped before its cap, every decision is that of
   ``caps=lengths``, bit for bit; after the first, the switch is never undone
   (``tests/test_ordered.py``). Until that first stop the caps are all the policy knows.
5. **Finish the riding decodes first** (``finish=gate`` or ``burst``; ``off`` by default).
   vLLM serves every running decode in every step, so a decode that rides a backlog's
   drain waits a whole prefill step per output. After shortest-first, more requests decode
   beside the long prompts' chunks (live on vLLM-CPU at 0.9 of capacity, mean TPOT 21%
   above the stock setting's, which gave back most of the TTFT gain: ``docs/results/
   real-traffic-live.md``). With the option a step may run the decodes alone (budget 0).
   Per step, from the bound StepCosts: ``b`` the budget (at most the ``P`` uncached
   prompt tokens pending), the drain's ``S = ceil(P / b)`` steps, ``t_b`` a step of ``b``
   tokens beside the running decodes (at context 0, as the knee's), ``t_0`` the
   decode-only step. A decode-only step moves one output of every riding decode from a
   step of ``t_b`` to one of ``t_0``: a decode with ``r_j <= S`` outputs left (all of
   them inside the drain) finishes ``t_b - t_0`` sooner; one that outlasts the drain
   rides ``S`` steps either way and finishes when it would have. The step delays each of
   the ``N`` pending prompts by ``t_0``, and every request that arrives before the
   engine next empties: ``N rho / (1 - rho)`` more in an M/G/1 queue at utilisation
   ``rho``. So the step runs the decodes alone iff

       short * (t_b - t_0) > t_0 * N / (1 - rho),   short = #{j : r_j <= S},

   never at ``rho >= 1``. No fitted factor: both sides are seconds of latency summed over
   requests. ``rho`` is read two ways:

   * ``gate``: the load gate's ``rho_L`` (model-clock scaled; the gate's window, or one
     of its own with the idle limit's chunks, ``c_max`` without one): a minute's average.
     Live on vLLM-CPU, where a decode-only step costs 1/25 of a 512-token step, it cut
     mean E2E to x0.72 and x0.71 of the tuned stock setting's at 0.9 of capacity in two
     runs (CI-better), and mean TPOT about 5x. Simulated on GPUs (a decode-only step
     1/6-1/8 of the budget's), where the Azure code trace's bursts hold hundreds of requests, the
     minute's average reads a burst as light, and each step the decodes take alone is
     passed on to the rest of the burst: mean E2E up to 7.6% above the rule before's
     (``docs/results/real-traffic.md``, "Finish the riding decodes first").
   * ``burst``: the larger of that and the load of the arrivals of the last ``S t_b``
     seconds, the drain's own length (their prefill work over that span). While the
     pending prompts arrived within their own drain this reads 1 or more, so the rule
     fires only for a backlog older than its drain. Within 3% of the rule before on every
     GPU pair and load simulated, but it gives back most of the CPU gain (x0.82 [0.65,
     1.03] at 0.9, within noise).

   With caps seen to be no lengths (rule 4) ``r_j`` is unknown and the rule is off.
   Invariants (``tests/test_ordered.py``): a budget of 0 only with a decode running and a
   prompt pending; between two steps that prefill, at most ``max_j r_j`` decode-only
   steps (decodes only drain, and only a prefill makes a new one), so every prompt is
   served; ``finish=off`` is the rule before, bit for bit. Cost: one pass over the view's
   requests at a step with decodes running and a budget, O(n) (with the option only).

**The model clock** (``clock_band=B``; 1.25 by default, 0 turns it off). Three rules
compare the cost model's seconds with the wall clock: the aging deadline (``aging * s_i``
against the wait), the drain floor (``D * T(t)`` against the same wait) and the load gate
(``rho_L``, model seconds of work per wall second). The budget's rules compare prices with
prices and need no clock. A model fitted on another host or day can be off in absolute
speed by a large factor (the CPU model here ran 1.9x faster than the host on 2026-12-07),
and then every deadline falls due that factor early and every load reads that factor
light. The policy measures the factor: ``ppas.policies.model_clock`` prices each executed
step's shape (``StepRecord``) with the policy's model and keeps ``k``, the measured wall
seconds per model second over the last 256 timed steps, moved only when the ratio leaves
``[k / B, k * B]``; the three rules multiply the model's seconds by ``k``. A model within
``B`` of the engine keeps its own seconds (``k = 1``; so does the simulator, whose engine
prices steps with the policy's model: its decisions are those of ``clock_band=0``, bit
for bit, ``tests/test_model_clock.py``). When ``k`` moves, the waiting index is made again, so
both decision paths read one ``k`` at each step.

**The aging bound** (what is guaranteed; ``tests/test_ordered.py`` checks it). Let ``d_i =
arrival_i + aging * s_i`` (``aging * k * s_i``, with ``k`` the model clock's scale at the
step, where it has moved). At every step at or after ``d_i`` at which ``i`` has reached
its FCFS turn (with ``turn > 0``; rule 1), every request listed ahead of ``i`` in
``prefill_order`` is overdue and arrived no later than ``i`` (ties by id), and when ``i``
is waiting but not listed, so is every waiting request listed. The engine serves the
running prompts first, then admits waiting ones as a prefix of this order (its waiting
loop stops at the first request it cannot admit, and the budget returned stops it within
the listed ones: below). Hence, once ``i`` is overdue and waiting, no request that arrived
after ``i`` is admitted before it, and ``i`` waits past ``d_i`` and its turn only for
requests that arrived before it (no starvation, whatever arrives later: the turn comes
once ``K`` times the prompt tokens waiting at its arrival have been admitted since, and
while nothing is admitted nobody passes ``i``). This bounds the *order*, not the latency:
the budget, the admission limit and the KV cache can still hold ``i`` while running
requests finish. ``s_i`` (``solo_estimate``; the solo prefill alone with ``solo=prefill``,
and once caps are seen to be no lengths, rule 4) is the linearised solo E2E of the whole
prompt (cached or not): its prefill in ``c_max``-token steps, then one decode step per
further output at its mean context. With the saturation rule the steps are the budget it
gives that prompt alone on an idle engine (``idle_chunk``), so the deadline follows the
steps the engine really runs: with ``c_sat=16384`` a 32k-token prompt alone is prefilled
in 16k-token steps, and the estimate stays within 1.1% of the engine's best solo latency
(``solo_latency``) where ``c_max``-token steps overestimated it by 8% (H100, Qwen3-8B).

**What is listed.** Without a ``waiting_log`` in the view (the vLLM plugin, hand-made
views), or where the saturation rule has room (its budget reads the waiting queue in the
engine's order, as last ordered whole: the knee below the ceiling, e.g. on an A100): every
pending prompt, in order (``decide_full``). With one and no prefix cache (the simulator
under FCFS without prefix caching; ``SchedulerView.waiting_log`` and ``prefix_caching``),
only what can matter: the order's waiting requests up to and including the first that the
walk of rule 3 does not admit (or the one that fills the budget), then every running
prompt; with nothing running, the waiting ones until their uncached tokens reach the
budget. The engine never admits past them: each waiting request it admits takes at least
its remaining uncached tokens from the budget, which the walk returns already spent by the
listed ones (or the engine stops earlier, on its KV blocks, ``max_num_seqs`` or the global
budget). The unlisted requests keep their queue order behind, and no step admits one, so
every admission, and the run, is the same as with the whole order
(``tests/test_ordered.py`` runs both, and pins the indexed path to
``decide_full(truncate=True)`` at every step). With a log and a prefix cache whose hit
changes the log reports (``WaitingLog.hits``: the simulator): every pending prompt, in
order, from the index: within a step the hits of prompts admitted earlier can grow those
of later ones (their blocks are cached as they are scheduled), and the budget this leaves
would go to the unlisted requests in the queue's order, so a cut order would not be the
whole one's. The index keeps each waiting request's key, re-read only when its hit is
reported changed (``tests/test_ordered.py`` pins it to ``decide_full`` at every step,
through hits grown, evictions and preemptions).

**Cost per step.** Without a log: one pass over the running requests and the budget,
O(running + number of candidate chunks), plus the saturation rule's pass over a prefix of
the waiting queue where it has room (it stops once more prompts can only confirm the
biggest chunk; the whole queue when it is short); when a waiting request can be admitted
(the running prompts leave budget, the limit and the KV cache leave room for the smallest
waiting footprint; with ``kv_peak`` the walk finds out, at the first request of the
order), one pass over the waiting queue and one sort of the pending prompts, O(n log n).
The footprint rule by the peak adds, at a step where the sum of the footprints refuses an
admission, a sort of the running decodes by outputs left (``ppas.policies.kv_room``). A
step that cannot admit returns no order (with ``kv_peak``, the order up to its first
request, with no budget for it): the engine keeps the waiting queue as last sorted (new
arrivals at its end) and admits nothing from it, so the bound is unaffected. With a log:
the same pass over the running requests (where the budget is fixed whatever rides, as with
the defaults on an H100 and an 8B model, only a sum of their footprints, skipped when the
running prompts take the budget, and a look for the running prompts from the end of the
list, where admissions go), then O((e + l + p) log n) for the waiting queue, where ``e``
is the log's events since the last step (arrivals, preemptions, admissions), ``l`` the
requests listed and ``p`` those turning overdue (each once; with the FCFS turn an entry
past its aging term waits in a heap of turn thresholds, so it moves at most twice), none
of it proportional to the queue; with a prefix cache, re-keying the requests whose hits
the log reports changed, then one sort of the kept keys (in C) and the listing, O(n log n)
but no hit read, no key made and no drain-floor term summed for a request whose hit held.
The FCFS turn's bookkeeping is O(e) with a log and one
pass over the waiting queue without (``FcfsTurns.note``). The index (``_WaitingIndex``)
holds one entry per waiting request, made from the request's fields when it enters the
queue (they do not change while it waits there), and reads the queue again whole, O(n),
only when the log cannot be followed (another engine's view, the clock going back, a count
that disagrees, or a log the engine trimmed, which it does after at least 2n + 4096
events: O(1) per event amortised).

Prefix caching: a waiting request's ``num_cached_tokens`` is taken off its remaining
prefill (its sort key and its admission allowance); footprints stay whole. Preemption: a
preempted request returns to the waiting queue with its arrival time and is ordered like
any other (its age keeps counting, and its FCFS turn is the one set at its arrival).

Without a cost model (``bind_cost_model(None)``): P-PAS's budget with the paper's
parameters (N_th = 2, B_cap = 2048), no admission limit, and the same order with ``s_i``
measured from ``recent_steps`` (the latest prefill step's seconds per token times the
prompt, plus the latest step's duration per further output; the prompt's term alone with
``solo=prefill`` or under rule 4); before any step has run
there is nothing to measure and the engine's own order is kept.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter, itemgetter
from typing import Any

from ppas.core.config import require
from ppas.core.decision import Decision
from ppas.core.view import (
    RequestSnapshot,
    RequestView,
    SchedulerView,
    WaitingLog,
    caps_are_lengths,
    is_pending_prefill,
)
from ppas.cost.base import CostModel, causal_pairs
from ppas.cost.steps import StepCosts
from ppas.policies.base import Policy, last_prefill_token_time
from ppas.policies.candidates import candidate_chunks
from ppas.policies.fcfs_turn import FcfsTurns
from ppas.policies.kv_room import KvRoom
from ppas.policies.model_clock import ModelClock
from ppas.policies.registry import register

#: KV tokens of block rounding counted per request when checking footprints.
SLACK = 16
#: Entries of ``prefill_ns``'s memo before it is emptied (bounded memory in a long-running
#: server; the pending prompts' terms are read again once, amortised O(1)).
NS_MEMO = 1 << 16


@dataclass(frozen=True)
class OrderedConfig:
    """``ordered:aging=25,c_min=512,c_max=4096,efficiency=0.95,kv_ratio=0,saturation=true,
    c_sat=0,ride_floor=false,kv_backlog=true,overdue_prefix=false,drain=1,idle_limit=-1,
    idle_util=0.5,idle_window=60,ride_drain=false,ride_ceiling=false,solo=e2e,
    kv_footprint=true,kv_peak=true,caps=observe,turn=1,clock_band=1.25,finish=off``.

    * ``aging``: K of the aging bound (module doc): a request that has waited K times its
      solo latency goes ahead of every non-overdue one (0: FCFS, no reordering).
    * ``c_min``, ``c_max``: the candidate chunks are the powers of two in [c_min, c_max];
      ``c_max`` is also the global MBT.
    * ``efficiency``: the budget is the smallest chunk reaching this share of the biggest
      chunk's prefill throughput beside the running decodes.
    * ``kv_ratio``: the admission limit is the decode batch whose KV reads are this many
      times the weights' (0: no limit).
    * ``saturation``: the saturation rule (module doc, 2): the budget may grow past the
      knee towards the most throughput-efficient chunk, up to ``c_max`` beside running
      decodes and up to ``c_sat`` without (false: the knee alone).
    * ``c_sat``: the ceiling of a decode-free step under the saturation rule (0: ``c_max``);
      when above ``c_max`` it is the global MBT.
    * ``ride_floor``: beside running decodes, the saturation rule picks from the knee
      with their cost per step counted (true: the rule before the idle floor), not from
      the knee of a decode-free step (false: the idle floor, module doc, 2).
    * ``kv_backlog``: the saturation rule's backlog counts the waiting prompts only up to
      the first whose footprint does not fit in the KV room left (true: the admissible
      backlog, module doc, 2), not the whole waiting queue (false).
    * ``overdue_prefix``: once any request is overdue, every request that arrived no
      later than the newest overdue one goes first, in arrival order (module doc, 1);
      false: only the overdue ones do.
    * ``turn``: K of the FCFS turn (module doc, 1): a request is overdue only once the
      uncached prompt tokens admitted since it arrived reach K times those waiting when
      it arrived (1, the default: where FCFS would have admitted it; 0: off, the rule
      before it).
    * ``drain``: D of the drain floor (module doc, 1): a request is overdue only once it
      has also waited D times the time the pending prompts take to prefill alone (0:
      off, the aging bound alone, the rule before it). 1, the default, is no fitted
      value: a request goes first once it has waited what a request arriving now would
      wait under FCFS.
    * ``idle_limit``: while at most one request waits, every prefill chunk is at most this
      many tokens (``Decision.chunk_limit``; module doc, 2, "The idle limit"; -1, the
      default: from the cost model, ``idle_limit_of``; 0: off).
    * ``idle_util``: the idle limit applies only while the prefill work of the last
      ``idle_window`` seconds' arrivals, in idle-limit chunks, is below this share of the
      window (module doc, 2, "The load gate"; 0: no gate; read only with a limit).
    * ``idle_window``: the window of arrivals the load gate reads, in seconds.
    * ``ride_drain``: the saturation rule charges a riding decode a bigger step only for
      the steps the drain lasts, ``min(r_i, S(c))`` of its ``r_i`` outputs left (module
      doc, 2; false: every output left).
    * ``ride_ceiling``: beside running decodes the saturation rule's ceiling is the bigger
      of ``c_max`` and the knee over ``[c_min, c_sat]`` with their cost per step counted
      (module doc, 2, "The riding knee"; false: ``c_max``); needs ``saturation`` and
      ``c_sat > c_max``.
    * ``solo``: the aging bound's solo latency ``s_i``: ``e2e``, the prefill and the decode
      steps, or ``prefill``, the prefill alone (module doc, 1, "The aging scale").
    * ``kv_footprint``: admit a waiting request only if the KV cache can hold it (prompt +
      outputs) to its last output beside the running ones (module doc, 3; false: the
      engine's admission).
    * ``kv_peak``: the footprint rule's room is the future peak of KV use, each decode
      freeing its KV when it finishes (module doc, 3, "By the future peak";
      ``ppas.policies.kv_room``); false: the sum of the footprints, the rule before.
    * ``caps``: ``observe``: a request's outputs are its ``max_tokens`` until the engine
      sees one stop before its cap, then no rule reads a cap as a length (module doc,
      "Caps, not lengths"); ``lengths``: always its ``max_tokens``.
    * ``finish``: ``gate`` or ``burst``: a step may run the riding decodes alone when the
      decodes that would ride the whole drain gain more than the step delays the pending
      prompts and the busy period's arrivals, the load read as the load gate's minute
      (``gate``) or at least the last drain's arrivals' (``burst``) (module doc, 5,
      "Finish the riding decodes first"); ``off``: never.
    * ``clock_band``: the model clock's band (module doc, "The model clock";
      ``ppas.policies.model_clock``): where the engine's measured steps run more than this
      factor slower or faster than the cost model prices them, the rules that compare
      model seconds with the wall clock (aging deadline, drain floor, load gate) scale the
      model's seconds by the measured ratio; 0: the model's seconds as they are.
    """

    aging: float = 25.0
    c_min: int = 512
    c_max: int = 4096
    efficiency: float = 0.95
    kv_ratio: float = 0.0
    saturation: bool = True
    c_sat: int = 0
    ride_floor: bool = False
    kv_backlog: bool = True
    overdue_prefix: bool = False
    drain: float = 1.0
    idle_limit: int = -1
    idle_util: float = 0.5
    idle_window: float = 60.0
    ride_drain: bool = False
    ride_ceiling: bool = False
    solo: str = "e2e"
    kv_footprint: bool = True
    kv_peak: bool = True
    caps: str = "observe"
    turn: float = 1.0
    clock_band: float = 1.25
    finish: str = "off"

    def __post_init__(self) -> None:
        require(self.clock_band == 0 or 1 < self.clock_band <= 100,
                f"clock_band must be 0 (off) or in (1, 100], got {self.clock_band}")
        require(self.solo in ("e2e", "prefill"),
                f"solo must be e2e or prefill, got {self.solo!r}")
        require(self.finish in ("off", "gate", "burst"),
                f"finish must be off, gate or burst, got {self.finish!r}")
        require(self.caps in ("observe", "lengths"),
                f"caps must be observe or lengths, got {self.caps!r}")
        require(self.idle_limit >= -1,
                f"idle_limit must be -1 (from the cost model), 0 (off) or a token count, "
                f"got {self.idle_limit}")
        require(0 <= self.idle_util <= 1, f"idle_util must be in [0, 1], got {self.idle_util}")
        require(0 < self.idle_window <= 86400,
                f"idle_window must be in (0, 86400] seconds, got {self.idle_window}")
        require(0 <= self.drain <= 1e3, f"drain must be in [0, 1000], got {self.drain}")
        require(0 <= self.turn <= 1e3, f"turn must be in [0, 1000], got {self.turn}")
        require(0 <= self.aging <= 1e6, f"aging must be in [0, 1e6], got {self.aging}")
        require(self.c_min >= 1, f"c_min must be >= 1, got {self.c_min}")
        require(self.c_max >= self.c_min,
                f"c_max must be >= c_min={self.c_min}, got {self.c_max}")
        require(0 < self.efficiency <= 1,
                f"efficiency must be in (0, 1], got {self.efficiency}")
        require(0 <= self.kv_ratio <= 1e3,
                f"kv_ratio must be in [0, 1000], got {self.kv_ratio}")
        require(self.c_sat == 0 or self.c_sat >= self.c_max,
                f"c_sat must be 0 or >= c_max={self.c_max}, got {self.c_sat}")
        # The riding knee widens the saturation rule's ceiling (module doc, 2): without
        # that rule, or without room above c_max, it would silently do nothing.
        require(not self.ride_ceiling or (self.saturation and self.c_sat > self.c_max),
                f"ride_ceiling needs saturation=true and c_sat > c_max={self.c_max}, "
                f"got saturation={str(self.saturation).lower()}, c_sat={self.c_sat}")


@register("ordered")
class Ordered(Policy):
    Config = OrderedConfig
    history_window = 16

    def __init__(self, config: OrderedConfig, spec: str | None = None) -> None:
        super().__init__(config, spec)
        self.chunks = candidate_chunks(config.c_min, config.c_max)
        self.costs: StepCosts | None = None
        self.chunk_time: list[float] = []  # StepCosts.step_time of each candidate chunk
        self.kv_capacity: int | None = None
        # The saturation rule's candidates, [c_min, max(c_max, c_sat)], and their costs
        # (a separate table so the knee's StepCosts, hence its decisions, stay as they are).
        self.sat_chunks = (candidate_chunks(config.c_min, max(config.c_max, config.c_sat))
                           if config.saturation else ())
        self.sat_costs: StepCosts | None = None
        self.sat_time: list[float] = []  # step_time of each saturation candidate
        self._idle: dict[int, int] = {}  # idle_chunk by prompt (a memo)
        self._solo: dict[tuple[int, int], float] = {}  # solo_estimate by shape (a memo)
        # prefill_ns by request id: (start, prompt, its term), the term read again only
        # when its start (computed + cached tokens) moves; emptied at NS_MEMO entries.
        self._ns: dict[str, tuple[int, int, int]] = {}
        self._index: _WaitingIndex | None = None  # the waiting queue, between steps
        self._solo_fn: Callable[[int, int], float] | None = None  # solo_estimate, memoised
        self._knee: int | None = None  # the budget at every step, where it is fixed
        # A request stopped before its cap: no rule reads caps as lengths (module doc, 4).
        self._loose = False
        self._idle_knee: int | None = None  # the knee with no decode riding, chunk(0, 0)
        self._just: dict[int, Decision] = {}  # Decision(budget), no order, by budget
        self._arrivals: _ArrivalWork | None = None  # the load gate's window (module doc, 2)
        self._finish = False  # finish the riding decodes first (module doc, 5), bound
        self._finish_window: _ArrivalWork | None = None  # its window where the gate has none
        # The idle limit in tokens (module doc, 2; 0: off), resolved by bind_cost_model.
        self._idle_limit = max(0, config.idle_limit)
        # The FCFS turn's clock and thresholds (module doc, 1; None: ``turn=0``).
        self._turns = FcfsTurns(config.turn) if config.turn > 0 else None
        # The model clock (module doc, "The model clock"; None: off or no cost model) and
        # the aging and drain factors in wall seconds per model second, its scale applied.
        self._clock: ModelClock | None = None
        self._aging, self._drain = config.aging, config.drain

    @property
    def max_num_batched_tokens(self) -> int:
        return int(max(self.config.c_max, self.config.c_sat))

    def bind_cost_model(self, cost_model: CostModel | None) -> None:
        super().bind_cost_model(cost_model)
        self.costs = None if cost_model is None else StepCosts(cost_model, self.chunks)
        costs = self.costs
        self.chunk_time = ([] if costs is None else
                           [costs.step_time(c, causal_pairs(c, 0)) for c in self.chunks])
        self.kv_capacity = None if cost_model is None else cost_model.kv_capacity_tokens
        self._idle_knee = None if costs is None else self.chunk(0, 0)
        self.sat_costs = (None if cost_model is None or not self.sat_chunks else
                          StepCosts(cost_model, self.sat_chunks))
        sat = self.sat_costs
        self.sat_time = ([] if sat is None else
                         [sat.step_time(c, causal_pairs(c, 0)) for c in self.sat_chunks])
        self._solo, self._idle = {}, {}
        self._ns = {}
        self._index = None
        self._loose = False
        self._turns = FcfsTurns(self.config.turn) if self.config.turn > 0 else None
        self._clock = (None if cost_model is None or not self.config.clock_band
                       else ModelClock(cost_model, self.config.clock_band))
        self._aging, self._drain = self.config.aging, self.config.drain
        self._idle_limit = lim = self.idle_limit_of()
        self._arrivals = (None if cost_model is None or not lim or not self.config.idle_util
                          else _ArrivalWork(StepCosts(cost_model, [lim]), lim,
                                            self.config.idle_window))
        # Finish the riding decodes first (module doc, 5): the load gate's window, or one
        # of its own at the budget's top where there is no gate.
        self._finish = self.config.finish != "off" and costs is not None
        self._finish_window = (
            None if cost_model is None or self.config.finish == "off"
            or self._arrivals is not None
            else _ArrivalWork(StepCosts(cost_model, [lim or self.config.c_max]),
                              lim or self.config.c_max, self.config.idle_window))
        cache, est = self._solo, self.solo_estimate

        def cached(prompt: int, outputs: int) -> float:
            s = cache.get((prompt, outputs))
            if s is None:
                s = cache[(prompt, outputs)] = est(prompt, outputs)
            return s

        self._solo_fn = cached if costs is not None else None
        # The budget whatever the decodes riding, when the knee (module doc, 2) is c_max
        # even with none: c's throughput share (c / C) (t_C + ride) / (t_c + ride) only
        # falls as ride grows when t_c <= t_C, and a share below efficiency by a margin
        # far above rounding stays below it in ``chunk``'s floats.
        # The saturation rule picks in [knee, ceiling]: no room when both are c_max.
        self._knee = None
        if costs is not None and costs.dec_ride >= 0 and costs.dec_kv >= 0 and (
                max(self.config.c_max, self.config.c_sat) == self.config.c_max):
            big, t_big = self.chunks[-1], self.chunk_time[-1]
            want = self.config.efficiency * (1 - 1e-9)
            if all(0 < t <= t_big and (c / t) / (big / t_big) <= want
                   for c, t in zip(self.chunks[:-1], self.chunk_time[:-1], strict=True)):
                self._knee = big

    def idle_limit_of(self) -> int:
        """The idle limit in tokens (module doc, 2, "The limit from the cost model"; 0:
        off): ``idle_limit`` where it is set; with -1 the biggest candidate chunk whose
        decode-free step costs at most twice a one-token step, at least ``c_min``, and 0
        where that reaches the global MBT or there is no cost model."""
        lim = self.config.idle_limit
        if lim >= 0:
            return lim
        costs = self.costs
        if costs is None:
            return 0
        fixed = costs.step_time(1, causal_pairs(1, 0))
        lim = self.chunks[0]
        for c, t in zip(self.chunks, self.chunk_time, strict=True):
            if t <= 2 * fixed:
                lim = c
        return 0 if lim >= self.max_num_batched_tokens else lim

    # -- the solo latency of the aging bound ------------------------------------------------
    def solo_estimate(self, prompt_tokens: int, outputs: int) -> float:
        """A request's latency alone on an idle engine, from the linearised costs: its
        prompt in steps of the budget an idle engine gives it (``c_max`` tokens; with
        ``c_sat``, ``idle_chunk``), then ``outputs - 1`` decode-only steps of one decode at
        the mean context (with ``solo=prefill``, the prompt's steps alone). 0 without a
        cost model."""
        costs = self.costs
        if costs is None:
            return 0.0
        c = self.config.c_max
        if self.sat_costs is not None:
            c = self.idle_chunk(prompt_tokens)
            if c > self.config.c_max:
                costs = self.sat_costs
        k, last = divmod(prompt_tokens, c)
        ttft = costs.run_time(c, 0, k) if k else 0.0
        if last:
            ttft += costs.step_time(last, causal_pairs(last, k * c))
        if self._loose or self.config.solo == "prefill":
            return ttft
        ctx = prompt_tokens + outputs / 2
        return ttft + (outputs - 1) * (costs.dec_base + costs.dec_alone + costs.dec_kv * ctx)

    def drain_floor(self, view: SchedulerView) -> float:
        """The drain floor (module doc, 1): ``drain`` times ``T``, the time the pending
        prompts take to prefill alone, each from its uncached tokens in ``c_max``-token
        steps (``StepCosts.prefill_time``, as ``solo_estimate`` prices a prefill); what
        a request arriving now would wait for its first chunk under FCFS, decodes and
        later arrivals aside. Summed in whole nanoseconds (``prefill_ns``: integers, so
        the indexed path's running sum is the same number; ``_full`` sums the same terms
        past its early returns, each hit read once). O(pending)."""
        if self.costs is None:
            return 0.0
        total = 0
        for r in view.requests:
            if is_pending_prefill(r):
                total += self.prefill_ns(r)
        return self.floor_of(total)

    def prefill_ns(self, r: RequestView) -> int:
        """``r``'s term of ``T`` (``drain_floor``), in whole nanoseconds."""
        p = r.prompt_tokens
        return self._prefill_ns(r.request_id, min(r.num_computed_tokens + r.num_cached_tokens,
                                                  p - 1), p)

    def _prefill_ns(self, rid: str, start: int, p: int) -> int:
        """``prefill_ns`` of request ``rid`` from its first uncached token ``start``."""
        assert self.costs is not None
        memo = self._ns.get(rid)  # a pending prompt's term changes only with start
        if memo is not None and memo[0] == start and memo[1] == p:
            return memo[2]
        ns = round(self.costs.prefill_time(self.config.c_max, start, p) * 1e9)
        if len(self._ns) >= NS_MEMO:  # (finished requests' terms: a server runs for days)
            self._ns.clear()
        self._ns[rid] = (start, p, ns)
        return ns

    def floor_of(self, total_ns: int) -> float:
        """The drain floor of ``T = total_ns`` nanoseconds, in wall seconds (one expression
        for both paths; ``_drain`` is ``drain`` times the model clock's scale)."""
        return self._drain * (total_ns * 1e-9)

    # -- the step's decision ------------------------------------------------------------------
    def decide(self, view: SchedulerView) -> Decision:
        if self._turns is not None:
            self._turns.note(view)
        if self._clock is not None:
            self._read_clock(view)
        if view.num_pending_prefills == 0:
            return Decision(self.config.c_max)
        arrivals = self._arrivals
        if arrivals is not None:
            arrivals.note(view)
        window = self._finish_window
        if window is not None:
            window.note(view)
        d = self._decide(view)
        if (self._finish and not self._loose and d.prefill_budget > 0
                and view.num_running_decodes):
            if self._finish_first(view, d.prefill_budget):
                return self._just.setdefault(0, Decision(0))  # decodes alone (module doc, 5)
        lim = self._idle_limit
        if lim and _num_waiting(view) <= 1 and (  # no backlog: short chunks (module doc, 2)
                arrivals is None or self._utilisation(arrivals, view.now)
                < self.config.idle_util):
            return Decision(d.prefill_budget, d.prefill_order, d.decodes_first, lim)
        return d

    def _finish_first(self, view: SchedulerView, budget: int) -> bool:
        """Whether this step runs the riding decodes alone (module doc, 5, "Finish the
        riding decodes first"): ``short * (t_b - t_0) > t_0 * N / (1 - rho)``."""
        costs = self.costs
        assert costs is not None
        arrivals = self._arrivals if self._arrivals is not None else self._finish_window
        rho = 0.0 if arrivals is None else self._utilisation(arrivals, view.now)
        if rho >= 1:  # saturated: the engine never empties, every delay is everyone's
            return False
        lefts: list[int] = []
        ride = alone = 0.0
        pending = 0
        for r in view.requests:  # O(n): the option's cost (module doc, 5)
            c, p = r.num_computed_tokens, r.prompt_tokens
            if r.is_running and c >= p:
                left = r.max_output_tokens - r.num_output_tokens
                if left > 0:
                    lefts.append(left)
                    ride += costs.dec_ride + costs.dec_kv * c
                    alone += costs.dec_alone + costs.dec_kv * c
            elif c < p:  # a pending prompt: its uncached tokens (at least one)
                pending += p - min(c + r.num_cached_tokens, p - 1)
        if not lefts or not pending:
            return False
        b = min(budget, pending)
        drain = -(-pending // b)  # the drain's steps at this budget
        short = sum(1 for x in lefts if x <= drain)
        if not short:
            return False
        t_b = costs.step_time(b, causal_pairs(b, 0)) + ride
        t_0 = costs.dec_base + alone
        if self.config.finish == "burst" and arrivals is not None:
            # the busy period's load is at least the last drain's worth of arrivals'
            k = 1.0 if self._clock is None else self._clock.scale
            rho = max(rho, arrivals.recent(view.now, drain * t_b * k) * k)
            if rho >= 1:
                return False
        return short * (t_b - t_0) > t_0 * view.num_pending_prefills / (1 - rho)

    def _read_clock(self, view: SchedulerView) -> None:
        """The model clock reads the steps since the last look (module doc, "The model
        clock"); where its scale moves, the aging and drain factors follow, and the
        waiting index, whose deadlines they set, is made again."""
        clock = self._clock
        assert clock is not None
        if clock.note(view.recent_steps):
            k = clock.scale
            self._aging, self._drain = self.config.aging * k, self.config.drain * k
            self._index = None

    def _utilisation(self, arrivals: _ArrivalWork, now: float) -> float:
        """The load gate's ``rho_L`` in wall seconds (the model clock's scale applied)."""
        rho = arrivals.utilisation(now)
        clock = self._clock
        return rho if clock is None else rho * clock.scale

    def _follow_lengths(self, view: SchedulerView) -> None:
        """Once a request has stopped before its cap (``OutputLengths``), no rule reads a
        cap as a length (module doc, "Caps, not lengths"): switched once per run, the
        solo latencies memoised and the waiting index made with the outputs dropped."""
        if self._loose or caps_are_lengths(view) or self.config.caps != "observe":
            return
        self._loose = True
        self._solo.clear()  # (shared with the memoised solo function)
        self._index = None

    def _decide(self, view: SchedulerView) -> Decision:
        log = view.waiting_log  # its items' keys are fixed, or their changes reported
        if log is not None and view.prefix_caching and log.hits is None:
            log = None
        if log is not None and self.costs is not None and self.config.aging > 0 and (
                self.sat_costs is None or self._knee is not None):  # saturation: no room
            if self.config.drain > 0 and self.config.overdue_prefix:  # (not indexed)
                return self._full(view, truncate=not view.prefix_caching)
            return self._decide_indexed(view, log)
        return self._full(view)

    def _running(self, view: SchedulerView, solo: Callable[[int, int], float] | None,
                 floor: float = 0.0) -> tuple[list[_Item], int, int, int, int, int, int]:
        """One pass over the running requests (the view lists them first): their pending
        prompts as items (``floor``: the drain floor), and (running, decodes, decodes'
        context, mean-context numerator, prompt tokens left, KV room left)."""
        k, now = self._aging, view.now
        items: list[_Item] = []
        n_running = n_dec = ctx_dec = ctx_run = running_left = held = 0
        for r in view.requests:
            if not r.is_running:
                break
            n_running += 1
            p, out, c = r.prompt_tokens, r.max_output_tokens, r.num_computed_tokens
            held += p + out
            if c < p:  # is_pending_prefill, inlined (r is running)
                items.append(_item(n_running - 1, r, True, solo, k, now, floor, self._turns))
                running_left += p - c
                ctx_run += p
            elif r.num_output_tokens < out:
                n_dec += 1
                ctx_dec += c
        ctx_run += ctx_dec
        room = ((self.kv_capacity if self.kv_capacity is not None else 0)
                - held - SLACK * n_running)
        return items, n_running, n_dec, ctx_dec, ctx_run, running_left, room

    def _budget(self, view: SchedulerView, n_running: int, n_dec: int, ctx_dec: int,
                ctx_run: int) -> tuple[int, int]:
        """(the step's budget, admission slots left) (module doc, 2 and 3)."""
        cfg = self.config
        if self.costs is None:  # model-free fallback: P-PAS, paper parameters
            budget = (min(2048, cfg.c_max) if view.num_pending_prefills >= 2
                      and view.num_running_decodes > 0 else cfg.c_max)
        else:
            budget = self.chunk(n_dec, ctx_dec, view)
        slots = (self.limit(ctx_run / n_running) - n_running
                 if n_running and cfg.kv_ratio > 0 and self.costs is not None else 1 << 30)
        return budget, slots

    def decide_full(self, view: SchedulerView, truncate: bool = False) -> Decision:
        """The straightforward decision: every pending prompt keyed and sorted, O(n log n).
        ``decide`` takes it where the view carries no ``waiting_log``; with ``truncate``
        its order is cut as the indexed path cuts it (``_walk``), which must then give the
        same Decision (``tests/test_ordered.py``). Called on its own it notes the view
        for the FCFS turn, as ``decide`` does (idempotent on one view)."""
        if self._turns is not None:
            self._turns.note(view)
        if self._clock is not None:
            self._read_clock(view)
        return self._full(view, truncate)

    def _full(self, view: SchedulerView, truncate: bool = False) -> Decision:
        """``decide_full`` once ``decide`` has noted the view (no second pass over it)."""
        if view.num_pending_prefills == 0:
            return Decision(self.config.c_max)
        self._follow_lengths(view)
        turns = self._turns
        solo = self.solo_function(view)
        k, now = self._aging, view.now
        # The running prompts keyed without the drain floor first: the floor is an O(queue)
        # sum (a hit read each), which the early returns below never use.
        items, n_running, n_dec, ctx_dec, ctx_run, running_left, room = self._running(
            view, solo)
        n_run_items = len(items)
        budget, slots = self._budget(view, n_running, n_dec, ctx_dec, ctx_run)
        kv = self.kv_capacity is not None and self.config.kv_footprint and not self._loose
        if n_running and self.costs is not None:
            if running_left >= budget:
                return Decision(budget)  # the running prompts take it all: none admitted
            if slots <= 0 or (kv and not self.config.kv_peak and room < min(
                    (r.prompt_tokens + r.max_output_tokens
                     for r in islice(view.requests, n_running, None)), default=room) + SLACK):
                return Decision(running_left)  # no waiting request fits: none admitted
        queue = list(islice(view.requests, n_running, None))
        # Each waiting prompt's first uncached token, its hit read once for floor and key.
        starts = [min(r.num_computed_tokens + r.num_cached_tokens, r.prompt_tokens - 1)
                  for r in queue]
        floor = 0.0
        if solo is not None and self.config.drain > 0 and self.costs is not None:
            prompts = [r for r in islice(view.requests, n_running) if is_pending_prefill(r)]
            prefill_ns = self._prefill_ns  # drain_floor's sum: the same integers
            floor = self.floor_of(sum(map(self.prefill_ns, prompts)) + sum(
                prefill_ns(r.request_id, st, r.prompt_tokens)
                for r, st in zip(queue, starts, strict=True)))
            if floor > 0 and prompts:  # the running prompts keyed again, with the floor
                items = [_item(0, r, True, solo, k, now, floor, turns) for r in prompts]
        if solo is None:
            for n, r in enumerate(queue, n_running):
                items.append(_item(n, r, False, solo, k, now))
        else:  # _item() inlined: the waiting queue is the long loop under overload
            append = items.append
            for r, st in zip(queue, starts, strict=True):
                prompt, rid, arrival = r.prompt_tokens, r.request_id, r.arrival_time
                out = r.max_output_tokens
                rem = prompt - st
                left = out - r.num_output_tokens
                wait = k * solo(prompt, left if left > 1 else 1)
                if wait < floor:  # the drain floor: both waits (module doc, 1)
                    wait = floor
                base = prompt + r.num_output_tokens + SLACK
                if now - arrival >= wait and (turns is None or turns.turned(rid)):
                    append(((0, arrival, 0.0, rid), rid, False, rem, prompt + out + SLACK, base))
                else:
                    append(((1, float(rem), arrival, rid), rid, False, rem, prompt + out + SLACK,
                            base))
        if solo is not None and self.config.overdue_prefix:
            _overdue_prefix(items)
        running_items = sorted(items[:n_run_items])
        items.sort()
        kv_room = self._kv_room(kv, room, islice(view.requests, n_running),
                                view.kv_shared_tokens)
        waiting = None
        if kv_room is not None and view.kv_shared_tokens:  # (prefix caching: kv_room)
            waiting = {r.request_id: r for r in queue}
        if not truncate:
            ids = tuple(it[1] for it in items)
            if not n_running or self.costs is None:
                return Decision(budget, ids)  # an idle engine always admits (liveness)
            budget, _ = _walk(iter(items), running_items, n_running, budget, slots, kv_room,
                              running_left, waiting)
            return Decision(budget, ids)
        return Decision(*_walk(iter(items), running_items, n_running, budget, slots, kv_room,
                               running_left, waiting))

    def _kv_room(self, kv: bool, room: int, running: Iterable[RequestView],
                 shared: int) -> KvRoom | None:
        """The footprint rule's room for one step's admissions (module doc, 3; None: off):
        ``room`` the capacity less the running requests' footprints, ``shared`` the tokens
        they hold jointly (``SchedulerView.kv_shared_tokens``)."""
        if not kv:
            return None
        assert self.kv_capacity is not None
        return KvRoom(self.kv_capacity, room, running, SLACK, self.config.kv_peak, shared)

    def _decide_indexed(self, view: SchedulerView, log: WaitingLog) -> Decision:
        """``decide_full(view, truncate=True)`` from the index of the waiting queue kept
        between steps (``_WaitingIndex``). Where the budget is fixed (``_knee``) and there
        is no admission limit, one sum over the running requests (their footprints) and
        their prompts looked for from the end of the running list (where admissions go),
        as many as the counts say; then the index's O((events + listed) log n)."""
        cfg = self.config
        self._follow_lengths(view)  # (before the index: the switch drops it)
        solo = self._solo_fn
        assert solo is not None
        idx = self._index
        if idx is None:
            idx = self._index = _WaitingIndex(self._aging, solo, cfg.overdue_prefix,
                                              self.prefill_ns if cfg.drain > 0 else None,
                                              self._turns)
        reqs = view.requests
        n_req = len(reqs)
        n_running = n_req - len(idx.live) if idx.follow(view, log) else -1
        # (the running requests, sliced once: a view's requests may be a lazy sequence)
        run = reqs[:n_running] if n_running > 0 else ()
        if not (0 <= n_running <= n_req and (n_running == 0 or run[-1].is_running)
                and (n_running == n_req or not reqs[n_running].is_running)):
            n_running = 0  # the log could not be followed: read the queue again
            for r in reqs:
                if not r.is_running:
                    break
                n_running += 1
            idx.rebuild(view, log, n_running)
            run = reqs[:n_running]
        items: list[_Item] | None = None
        just = self._just  # Decision(budget) by budget (a Decision is immutable)
        if self._knee is not None and cfg.kv_ratio <= 0:
            left = view.num_pending_prefills - (n_req - n_running)  # running prompts
            prompts: list[RequestView] = []
            running_left = 0
            if left > 0:
                for j in range(n_running - 1, -1, -1):
                    r = run[j]
                    c, p = r.num_computed_tokens, r.prompt_tokens
                    if c < p:
                        prompts.append(r)
                        running_left += p - c
                        left -= 1
                        if not left:
                            break
            budget, slots = self._knee, 1 << 30
            if left:  # the counts disagree with the requests: read them one by one
                pass
            elif n_running and running_left >= budget:
                d = just.get(budget)  # the running prompts take it all: none admitted
                return d if d is not None else just.setdefault(budget, Decision(budget))
            else:
                k, now = self._aging, view.now
                floor = (self.floor_of(idx.waiting_ns + sum(map(self.prefill_ns, prompts)))
                         if cfg.drain > 0 else 0.0)
                items = [_item(0, r, True, solo, k, now, floor, self._turns)
                         for r in prompts]
                # (the footprints prompt + outputs of the running requests, summed in C)
                held = sum(map(_prompt_tokens, run)) + sum(map(_max_output_tokens, run))
                room = ((self.kv_capacity if self.kv_capacity is not None else 0)
                        - held - SLACK * n_running)
        if items is None:
            floor = 0.0
            if cfg.drain > 0:  # the running prompts' terms, then the index's sum
                floor = self.floor_of(idx.waiting_ns + sum(
                    self.prefill_ns(r) for r in run if r.num_computed_tokens < r.prompt_tokens))
            items, n_running, n_dec, ctx_dec, ctx_run, running_left, room = self._running(
                view, solo, floor)
            budget, slots = self._budget(view, n_running, n_dec, ctx_dec, ctx_run)
        kv = self.kv_capacity is not None and self.config.kv_footprint and not self._loose
        if n_running:
            if running_left >= budget:
                return Decision(budget)  # the running prompts take it all: none admitted
            if slots <= 0 or (kv and not cfg.kv_peak and room < idx.min_footprint(room) + SLACK):
                d = just.get(running_left)  # no waiting request fits: none admitted
                return d if d is not None else just.setdefault(running_left,
                                                               Decision(running_left))
        idx.promote(view.now)
        newest = _overdue_prefix(items, idx.newest_overdue()) if cfg.overdue_prefix else -math.inf
        items.sort()
        kv_room = self._kv_room(kv, room, run, view.kv_shared_tokens)
        waiting = (_LiveRequests(idx.live) if kv_room is not None and view.kv_shared_tokens
                   else None)
        if view.prefix_caching:
            # Every pending prompt listed (``decide_full``'s order, not cut): the hits of
            # prompts admitted earlier in the step can grow those of later ones and leave
            # budget that a cut order would give to the queue's unlisted requests. The
            # entries' keys are kept (their hits' changes reported); sorted once, in C,
            # as ``in_order`` would yield them: overdue by both tests, then fresh.
            now = view.now
            queue = [e.late if e.overdue and now - e.arrival >= floor else e.fresh
                     for e in idx.live.values()]
            if newest > -math.inf:
                _overdue_prefix(queue, newest)
            queue.sort()
            whole = list(_merged(items, iter(queue))) if items else queue
            ids = tuple(it[1] for it in whole)
            if n_running:
                budget, _ = _walk(iter(whole), items, n_running, budget, slots, kv_room,
                                  running_left, waiting)
            return Decision(budget, ids)
        try:
            order = idx.in_order(newest, floor)
            return Decision(*_walk(_merged(items, order) if items else order, items, n_running,
                                   budget, slots, kv_room, running_left, waiting))
        finally:
            idx.restore()

    def solo_function(self, view: SchedulerView) -> Callable[[int, int], float] | None:
        """``s_i`` of the aging bound as a function of (prompt tokens, outputs left): the
        cost model's (``solo_estimate``, memoised by shape), else measured from the recent
        steps (module doc); None when aging is off or nothing is measured yet."""
        if self.config.aging <= 0:
            return None
        if self._solo_fn is not None:
            return self._solo_fn
        per_tok = last_prefill_token_time(view.recent_steps)
        if per_tok is None:
            return None
        if self._loose or self.config.solo == "prefill":
            return lambda prompt, outputs: per_tok * prompt
        step = view.recent_steps[-1].duration_s
        return lambda prompt, outputs: per_tok * prompt + step * (outputs - 1)

    def limit(self, mean_context: float) -> int:
        """The admission limit (module doc, 3): the decode batch whose KV reads per step
        are ``kv_ratio`` times the weights' (at least 1)."""
        costs = self.costs
        assert costs is not None
        per = costs.dec_alone + costs.dec_kv * mean_context
        if per <= 0:
            return 1 << 30
        return max(1, int(self.config.kv_ratio * costs.dec_base / per))

    def chunk(self, num_decodes: int, decode_ctx: int,
              view: SchedulerView | None = None) -> int:
        """The budget beside running decodes (module doc, 2): the smallest candidate chunk
        whose prefill throughput beside them, ``c / (S(c) + decodes' cost)``, reaches
        ``efficiency`` times the biggest chunk's (the knee); given the view (and
        ``saturation``), grown by ``saturation_chunk`` when the pending prompts outrun it."""
        costs = self.costs
        assert costs is not None
        ride = num_decodes * costs.dec_ride + costs.dec_kv * decode_ctx
        knee = _knee(self.chunks, self.chunk_time, ride, self.config.efficiency)
        if view is None or self.sat_costs is None:
            return knee
        # The idle floor (module doc, 2): beside decodes the rule picks from the knee of a
        # decode-free step up (the knee only grows with the decodes riding).
        floor = (knee if not num_decodes or self.config.ride_floor or self._idle_knee is None
                 else min(knee, self._idle_knee))
        # The riding knee (module doc, 2): beside decodes the ceiling is c_max, or the knee
        # over the saturation candidates with their cost counted where that is bigger.
        ceiling = None
        if num_decodes and self.config.ride_ceiling:
            ceiling = max(self.config.c_max, _knee(self.sat_chunks, self.sat_time, ride,
                                                   self.config.efficiency))
        return self.saturation_chunk(view, floor, num_decodes > 0, ride, ceiling=ceiling)

    def saturation_chunk(self, view: SchedulerView, knee: int, decodes: bool, ride: float,
                         early_exit: bool = True, ceiling: int | None = None) -> int:
        """The saturation budget (module doc, 2): the frontier chunk in [knee, ceiling]
        minimising ``J(c) = t(c) (L + Q / c + (N - 1) / 2)``, ``ride`` the running decodes' cost
        per step. One pass over the running requests (``L``, the running prompts), then
        the waiting ones in the view's order, stopped early (``early_exit``, the same
        result) once the queued tokens pass ``C*`` and the frontier's top is the argmin:
        a prompt queued after ``C`` tokens raises ``J(c)`` by ``t(c) (1/2 + C / c)``, which
        is smaller for the top than for a chunk ``a`` below it once
        ``C >= (t(top) - t(a)) / (2 (t(a) / a - t(top) / top))``."""
        if ceiling is None:
            ceiling = self.config.c_max if decodes else self.sat_chunks[-1]
        cands = sorted({knee, *(c for c in self.sat_chunks if knee < c <= ceiling)})
        if len(cands) < 2:
            return knee
        top = cands[-1]
        pairs = 0.0  # causal pairs of the first ``top`` tokens of the order
        outputs_left = n = n_running = 0
        queued, q = 0, 0.0
        frontier: list[tuple[int, int, float]] = []  # (c, tokens, t(c)) once queued >= top
        c_star, ft = 0.0, top

        def take(r: RequestView) -> None:
            nonlocal n, queued, q, pairs
            prompt = r.prompt_tokens
            rem = prompt - min(r.num_computed_tokens + r.num_cached_tokens, prompt - 1)
            if queued < top:  # this prompt's tokens within the first ``top``
                x = min(rem, top - queued)
                pairs += x * (prompt - rem + (x + 1) / 2)
            queued += rem
            n += 1
            q += queued

        held = 0
        rides: list[int] | None = [] if self.config.ride_drain else None
        if rides is not None:
            early_exit = False  # (the argmin's stopping rule assumes every output is charged)
        # Caps, not lengths (module doc, rule 4): the footprints count a request's outputs
        # as the mean finished request's (at most its cap; a running one's at least those
        # it has, plus one); ``L`` still reads the caps.
        mean = (math.ceil(view.output_lengths.mean)
                if self._loose and view.output_lengths is not None else None)
        for r in view.requests:
            if not r.is_running:
                break
            n_running += 1
            o, cap = r.num_output_tokens, r.max_output_tokens
            held += r.prompt_tokens + (cap if mean is None or mean >= cap else max(mean, o + 1))
            if is_pending_prefill(r):
                take(r)
            elif o < cap:
                outputs_left += cap - o
                if rides is not None:
                    rides.append(cap - o)
        # The admissible backlog (module doc, 2): with ``kv_backlog``, the waiting prompts
        # count up to the first the footprint rule cannot admit (rule 3; with the outputs
        # estimated, ``mean``, by the sum of the footprints).
        kv = (KvRoom(self.kv_capacity, self.kv_capacity - held - SLACK * n_running,
                     islice(view.requests, n_running), SLACK,
                     self.config.kv_peak and mean is None, view.kv_shared_tokens)
              if self.config.kv_backlog and self.kv_capacity is not None else None)
        for r in islice(view.requests, n_running, None):
            if kv is not None:
                cap = r.max_output_tokens
                p = r.prompt_tokens
                if not kv.admit(p + r.num_output_tokens + SLACK,
                                p + (cap if mean is None else min(cap, mean)) + SLACK, r):
                    break
            take(r)
            if early_exit and queued >= top:
                if not frontier:
                    frontier = self._frontier(cands, pairs, queued, ride)
                    if len(frontier) < 2:
                        return frontier[0][0]
                    ft, mt, tt = frontier[-1]
                    c_star = max((tt - t) / (2 * (t / m - tt / mt)) for _, m, t in frontier[:-1])
                if queued >= c_star and _argmin(frontier, outputs_left, q, n) == ft:
                    return ft
        if n == 0:
            return knee
        frontier = self._frontier(cands, pairs, queued, ride)
        if rides is not None:
            return _argmin_drain(frontier, rides, q, n, queued)
        return _argmin(frontier, outputs_left, q, n)

    def _frontier(self, cands: list[int], pairs: float, queued: int,
                  ride: float) -> list[tuple[int, int, float]]:
        """``(c, m, t(c))`` of the candidates that clear strictly more tokens per second
        than every smaller one: ``m = min(c, queued)`` the tokens the step takes, ``t(c)``
        that step beside the running decodes, its causal pairs ``m * rho`` with ``rho``
        the pairs per token of the largest candidate's tokens (``pairs`` over them).
        Over those tokens every candidate does the same attention work, whatever its
        chunking (a prompt's pairs do not depend on how it is cut), so the pairs per token
        are the same for all: counting each candidate's own first step instead would
        credit a small chunk with the low-context head of a long prompt."""
        costs = self.sat_costs
        assert costs is not None
        out: list[tuple[int, int, float]] = []
        best = float("inf")
        top = min(cands[-1], queued)
        rho = pairs / top if top > 0 else 0.0
        for c in cands:
            m = min(c, queued)
            if m <= 0 or (out and m <= out[-1][1]):
                continue  # an empty step, or the same step as a smaller candidate's
            t = costs.step_time(m, m * rho) + ride
            if t / m < best:
                best = t / m
                out.append((c, m, t))
        return out or [(cands[0], max(1, queued), 0.0)]

    def idle_chunk(self, prompt_tokens: int) -> int:
        """The saturation budget of one ``prompt_tokens`` prompt alone on an idle engine
        (no decode riding, the knee at no decodes as its floor), memoised."""
        c = self._idle.get(prompt_tokens)
        if c is None:
            costs = self.costs
            assert costs is not None
            knee = self.chunk(0, 0) if self._idle_knee is None else self._idle_knee
            if knee >= self.sat_chunks[-1]:
                c = self._idle[prompt_tokens] = knee  # (no candidate above the knee)
                return c
            p = RequestSnapshot("solo", 0.0, max(1, prompt_tokens))
            v = SchedulerView(0.0, (p,), 1, 0, self.max_num_batched_tokens, 1)
            c = self._idle[prompt_tokens] = self.saturation_chunk(v, knee, False, 0.0)
        return c


def _knee(chunks: Sequence[int], times: Sequence[float], ride: float, efficiency: float) -> int:
    """The smallest of ``chunks`` (ascending; ``times`` their steps alone) whose prefill
    throughput beside decodes costing ``ride`` per step, ``c / (t(c) + ride)``, reaches
    ``efficiency`` times the biggest chunk's (module doc, 2)."""
    want = efficiency * (chunks[-1] / (times[-1] + ride))
    for c, t in zip(chunks, times, strict=True):
        if c / (t + ride) >= want:
            return c
    return chunks[-1]


def _argmin(frontier: list[tuple[int, int, float]], outputs_left: int, q: float,
            n: int) -> int:
    """The chunk of ``frontier`` (``(c, m, t(c))``, ascending) minimising
    ``J = t(c) (outputs_left + q / m + (n - 1) / 2)``; ties to the smaller chunk."""
    best_c, best_j = frontier[0][0], float("inf")
    for c, m, t in frontier:
        j = t * (outputs_left + q / m + (n - 1) / 2)
        if j < best_j:
            best_c, best_j = c, j
    return best_c


def _argmin_drain(frontier: list[tuple[int, int, float]], rides: list[int], q: float,
                  n: int, queued: int) -> int:
    """``_argmin`` with every riding decode charged only for the drain (``ride_drain``,
    module doc, 2): the ``queued`` tokens take ``S = queued / m`` steps of ``t(c)``, and a
    decode with ``r`` outputs left waits ``t(c)`` for ``min(r, S)`` of them::

        J = t(c) (sum_i min(r_i, S) + q / m + (n - 1) / 2);

    ties to the smaller chunk."""
    best_c, best_j = frontier[0][0], float("inf")
    for c, m, t in frontier:
        s = queued / m
        j = t * (sum(r if r < s else s for r in rides) + q / m + (n - 1) / 2)
        if j < best_j:
            best_c, best_j = c, j
    return best_c


_prompt_tokens = attrgetter("prompt_tokens")
_max_output_tokens = attrgetter("max_output_tokens")

#: One pending prompt: (sort key, id, running, uncached prompt tokens, footprint, base);
#: the footprint ``f`` (prompt + outputs + slack) and base ``b`` (prompt + outputs it has
#: + slack) are the footprint rule's (``KvRoom.admit``).
_Item = tuple[tuple[int, float, float, str], str, bool, int, int, int]


def _num_waiting(view: SchedulerView) -> int:
    """The waiting requests of ``view`` (it lists the running ones first): O(running)."""
    n = 0
    for r in view.requests:
        if not r.is_running:
            break
        n += 1
    return len(view.requests) - n


def _item(n: int, r: RequestView, running: bool, solo: Callable[[int, int], float] | None,
          k: float, now: float, floor: float = 0.0, turns: FcfsTurns | None = None) -> _Item:
    """``r``'s item (module doc, 1); ``n`` its place in the view (the key without aging);
    ``floor``: the drain floor (0: none; ``max`` with it is the aging term exactly);
    ``turns``: the FCFS turn's (None: off)."""
    prompt, rid, arrival = r.prompt_tokens, r.request_id, r.arrival_time
    rem = prompt - min(r.num_computed_tokens + r.num_cached_tokens, prompt - 1)
    if solo is None:  # nothing to age by: the engine's own order
        key = (0, float(n), 0.0, rid)
    elif now - arrival >= max(k * solo(prompt, max(1, r.max_output_tokens
                                                   - r.num_output_tokens)), floor) and (
            turns is None or turns.turned(rid)):
        key = (0, arrival, 0.0, rid)  # overdue: first, FCFS
    else:
        key = (1, float(rem), arrival, rid)  # shortest remaining first
    return (key, rid, running, rem, prompt + r.max_output_tokens + SLACK,
            prompt + r.num_output_tokens + SLACK)


def _overdue_prefix(items: list[_Item], newest: float = -math.inf) -> float:
    """The overdue prefix (``overdue_prefix``, module doc, 1), in place: ``A``, the newest
    arrival among ``newest`` and the overdue ``items``; every item that arrived no later
    than ``A`` keyed as an overdue one (first, in arrival order). Returns ``A`` (-inf:
    nothing overdue, nothing changed)."""
    for it in items:
        key = it[0]
        if key[0] == 0 and key[1] > newest:
            newest = key[1]
    if newest > -math.inf:
        for j, it in enumerate(items):
            key = it[0]
            if key[0] == 1 and key[2] <= newest:
                items[j] = ((0, key[2], 0.0, key[3]), it[1], it[2], it[3], it[4], it[5])
    return newest


def _merged(first: list[_Item], rest: Iterator[_Item]) -> Iterator[_Item]:
    """The sorted ``first`` merged into the sorted ``rest`` (read one ahead)."""
    i, n = 0, len(first)
    for it in rest:
        while i < n and first[i] < it:
            yield first[i]
            i += 1
        yield it
    yield from first[i:]


def _walk(items: Iterator[_Item], running_items: list[_Item], n_running: int, budget: int,
          slots: int, room: KvRoom | None, running_left: int,
          waiting: Mapping[str, RequestView] | None = None) -> tuple[int, tuple[str, ...]]:
    """Admission walked in the order of ``items`` (module doc, 3): (the budget, the ids
    listed). Listed: the items up to the first the engine cannot admit (the walk stops
    there: the budget returned leaves it nothing), then the running prompts not reached.
    With nothing running: the items until their tokens left reach the budget. ``room``:
    the footprint rule's (None: no KV check, the engine's admission). ``waiting``: the
    waiting requests by id, for the credit of shared blocks (``KvRoom.admit``; None:
    nothing shared)."""
    listed: list[str] = []
    if not n_running:  # an idle engine always admits (liveness), up to the budget
        allowance = 0
        for it in items:
            listed.append(it[1])
            allowance += it[3]
            if allowance >= budget:
                break
        return budget, tuple(listed)
    allowance = running_left
    seen = 0  # running prompts reached
    out = allowance
    for _, rid, running, rem, footprint, base in items:
        listed.append(rid)
        if running:
            seen += 1
            continue
        if slots <= 0 or (room is not None and not room.admit(
                base, footprint, None if waiting is None else waiting[rid])):
            out = allowance
            break
        slots -= 1
        allowance += rem
        if allowance >= budget:
            out = budget
            break
    else:
        out = allowance
    listed.extend(it[1] for it in running_items[seen:])
    return out, tuple(listed)


class _Entry:
    """A waiting request in ``_WaitingIndex``: its items fresh and overdue, its aging
    threshold ``k * s_i``, its smallest footprint (prompt + outputs)."""

    __slots__ = ("gen", "arrival", "threshold", "fresh", "late", "overdue", "ns", "r")

    def __init__(self, gen: int, arrival: float, threshold: float, fresh: _Item,
                 late: _Item, overdue: bool, ns: int, r: RequestView) -> None:
        self.gen, self.arrival, self.threshold = gen, arrival, threshold
        self.fresh, self.late, self.overdue = fresh, late, overdue
        self.ns = ns  # its term of the drain floor's sum (``drain``), nanoseconds
        self.r = r  # the request (its shared blocks: the footprint rule's credit)


class _LiveRequests(Mapping[str, RequestView]):
    """The index's waiting requests by id (``_walk``'s ``waiting``), read through its
    entries."""

    __slots__ = ("live",)

    def __init__(self, live: dict[str, _Entry]) -> None:
        self.live = live

    def __getitem__(self, rid: str) -> RequestView:
        return self.live[rid].r

    def __iter__(self) -> Iterator[str]:
        return iter(self.live)

    def __len__(self) -> int:
        return len(self.live)


_arrival_of = itemgetter(0)  # an _ArrivalWork entry's arrival


class _ArrivalWork:
    """The load gate's window (module doc, 2): the arrivals of the last ``window``
    seconds, each with its prompt's prefill time alone in ``limit``-token chunks.

    Every request is counted once, when ``note`` first sees it pending: from the waiting
    log's arrival events where the view has one it can follow (O(events) a step), else
    from a pass over the view's requests (O(n)). A request returning to the queue
    (preemption) is not counted again while its arrival is in the window (``seen``), and
    one whose arrival is older than the window cannot count. Invariant: ``total`` is the
    sum of ``work`` over ``queue`` and ``seen`` its ids; ``queue`` is in arrival order (a
    request noted after a later arrival, as a view that lists a running prompt before an
    older waiting one gives them, is inserted in place; the simulator's log notes them as
    they arrive), so after ``utilisation(now)`` its first entry arrived at or after
    ``now - window``, and ``recent`` may stop at the first older arrival."""

    __slots__ = ("costs", "limit", "window", "queue", "seen", "total", "pos")

    def __init__(self, costs: StepCosts, limit: int, window: float) -> None:
        self.costs, self.limit, self.window = costs, limit, window
        self.queue: deque[tuple[float, str, float]] = deque()  # (arrival, id, work)
        self.seen: set[str] = set()  # the ids in ``queue``
        self.total = 0.0
        self.pos: int | None = None  # the next waiting-log event to read

    def _add(self, r: RequestView, start: float) -> None:
        rid, arrival = r.request_id, r.arrival_time
        if arrival < start or rid in self.seen:
            return
        w = self.costs.prefill_time(self.limit, 0, r.prompt_tokens)
        self.seen.add(rid)
        q = self.queue
        if q and arrival < q[-1][0]:  # noted out of order (a view's running requests come
            q.insert(bisect_right(q, arrival, key=_arrival_of), (arrival, rid, w))  # first)
        else:
            q.append((arrival, rid, w))
        self.total += w

    def note(self, view: SchedulerView) -> None:
        """Count the requests ``view`` shows for the first time."""
        start, log, pos = view.now - self.window, view.waiting_log, self.pos
        if log is not None and pos is not None and log.base <= pos <= log.end:
            for entered, r in islice(log.events, pos - log.base, None):
                if entered:
                    self._add(r, start)
        else:  # no log, or one this window cannot follow: every request in the view
            for r in view.requests:
                if is_pending_prefill(r):
                    self._add(r, start)
        self.pos = None if log is None else log.end

    def recent(self, now: float, span: float) -> float:
        """The prefill work of the arrivals of the last ``span`` seconds (at most the
        window) over ``span``: the load of a burst (``finish=burst``, module doc, 5).
        O(those arrivals): ``queue`` is read from its newest end."""
        if span <= 0:
            return 0.0
        start, work = now - span, 0.0
        for arrival, _, w in reversed(self.queue):
            if arrival < start:
                break
            work += w
        return work / span

    def utilisation(self, now: float) -> float:
        """``rho_L``: the window's prefill work in ``limit``-token chunks over the window."""
        q, start = self.queue, now - self.window
        while q and q[0][0] < start:
            _, rid, w = q.popleft()
            self.seen.discard(rid)
            self.total -= w
        if not q:
            self.total = 0.0  # no rounding carried past an empty window
        return self.total / self.window


class _WaitingIndex:
    """The waiting queue of one engine, indexed in the policy's order between steps: kept
    in step with the view by its ``WaitingLog`` (each arrival, preemption and admission
    once), read again whole only when the log cannot be followed (another engine's view, a
    trimmed log, the clock going back, a count that disagrees with the view).

    Heaps, with entries dropped lazily (an entry counts while its request's ``gen`` is the
    live one): overdue items by (arrival, id), fresh ones by (uncached tokens, arrival,
    id), fresh ones by aging threshold (``promote`` moves them when due), and every
    waiting request by its smallest footprint. A waiting request's fields do not change
    while it waits (``SchedulerView.waiting_log``), so its items are made once, on entry;
    only "overdue" changes, once, with the clock. With ``prefix`` (``overdue_prefix``) two
    more: every waiting request by (arrival, id), and the overdue ones by newest arrival.
    Memory: O(waiting requests); heaps are rebuilt when stale entries outnumber live
    ones."""

    def __init__(self, aging: float, solo: Callable[[int, int], float],
                 prefix: bool = False, ns: Callable[[RequestView], int] | None = None,
                 turns: FcfsTurns | None = None) -> None:
        self.k, self.solo, self.prefix = aging, solo, prefix
        # With the FCFS turn: the entries past their aging threshold that have not reached
        # their turn, by its threshold (``promote`` moves them once the clock passes it).
        self.turns = turns
        self.turn_wait: list[tuple[float, int, str]] = []  # (theta, gen, id)
        # With the drain floor (``ns``: a request's term of its sum): the waiting
        # requests' terms summed, and the overdue ones by the fresh key too (those the
        # floor keeps fresh are read from there).
        self.ns, self.waiting_ns = ns, 0
        self.late_fresh: list[tuple[float, float, str, int, _Item]] = []
        self.log: WaitingLog | None = None
        self.pos = 0
        self.hpos = 0  # the log's hit reports read (``WaitingLog.hits``)
        self.now = -math.inf
        self.gen = 0
        self.live: dict[str, _Entry] = {}
        # (the sort key's varying part, flat: the same order within a heap, cheaper)
        self.late: list[tuple[float, str, int, _Item]] = []  # (arrival, id, gen, item)
        self.fresh: list[tuple[float, float, str, int, _Item]] = []  # (rem, arrival, ...)
        self.due: list[tuple[float, int, str]] = []
        self.small: list[tuple[int, int, str]] = []
        self.byarr: list[tuple[float, str, int, _Item]] = []  # (arrival, id, gen, item)
        self.newest: list[tuple[float, str, int]] = []  # (-arrival, id, gen), overdue
        self.popped: list[tuple[int, tuple[Any, ...]]] = []  # (0 fresh, 1 late, 2 byarr)

    def follow(self, view: SchedulerView, log: WaitingLog) -> bool:
        """Apply the log's events since the last step; False (nothing applied) when the
        log cannot be followed: the caller then checks the count and ``rebuild``s."""
        now = view.now
        if (log is not self.log or self.pos < log.base or now < self.now
                or self.hpos < log.hits_base):
            return False
        self.now = now
        end, hits = log.end, log.hits
        if self.pos == end and (hits is None or self.hpos == log.hits_end):
            return True
        live = self.live
        for entered, r in log.events[self.pos - log.base:]:
            if entered:
                self.add(r, now)
            else:
                e = live.pop(r.request_id, None)
                if e is not None:
                    self.waiting_ns -= e.ns
        self.pos = end
        if hits is not None:  # hits changed (prefix caching): those requests keyed again
            again: set[str] = set()
            for r in hits[self.hpos - log.hits_base:]:
                rid = r.request_id
                e = live.get(rid)
                if e is not None and rid not in again:
                    again.add(rid)
                    self.waiting_ns -= e.ns
                    self.add(r, now)
            self.hpos = log.hits_end
        if len(self.fresh) + len(self.late) + len(self.due) + len(self.small) + len(
                self.byarr) + len(self.newest) + len(self.late_fresh) + len(
                self.turn_wait) > 8 * len(live) + 256:
            self.compact()
        return True

    def rebuild(self, view: SchedulerView, log: WaitingLog, n_running: int) -> None:
        self.log, self.pos, self.hpos, self.now = log, log.end, log.hits_end, view.now
        self.live.clear()
        self.waiting_ns = 0
        for h in (self.late, self.fresh, self.due, self.small, self.byarr, self.newest,
                  self.late_fresh, self.turn_wait):
            h.clear()
        for r in islice(view.requests, n_running, None):
            self.add(r, view.now)

    def compact(self) -> None:
        """The heaps again from the live entries only."""
        live = self.live
        self.late[:] = [(e.arrival, rid, e.gen, e.late) for rid, e in live.items()
                        if e.overdue]
        self.fresh[:] = [(e.fresh[0][1], e.arrival, rid, e.gen, e.fresh)
                         for rid, e in live.items() if not e.overdue]
        self.due[:] = [(e.arrival + e.threshold, e.gen, rid) for rid, e in live.items()
                       if not e.overdue]
        self.turn_wait.clear()  # (their due entries are back: promote sorts them again)
        self.small[:] = [(e.fresh[4] - SLACK, e.gen, rid) for rid, e in live.items()]
        if self.prefix:
            self.byarr[:] = [(e.arrival, rid, e.gen, e.late) for rid, e in live.items()]
            self.newest[:] = [(-e.arrival, rid, e.gen) for rid, e in live.items()
                              if e.overdue]
            heapq.heapify(self.byarr)
            heapq.heapify(self.newest)
        if self.ns is not None:
            self.late_fresh[:] = [(e.fresh[0][1], e.arrival, rid, e.gen, e.fresh)
                                  for rid, e in live.items() if e.overdue]
            heapq.heapify(self.late_fresh)
        heapq.heapify(self.late)
        heapq.heapify(self.fresh)
        heapq.heapify(self.due)
        heapq.heapify(self.small)

    def add(self, r: RequestView, now: float) -> None:
        """A request entering the waiting queue (``decide_full``'s items, made once)."""
        prompt, rid, arrival = r.prompt_tokens, r.request_id, r.arrival_time
        out = r.max_output_tokens
        rem = prompt - min(r.num_computed_tokens + r.num_cached_tokens, prompt - 1)
        left = out - r.num_output_tokens
        threshold = self.k * self.solo(prompt, left if left > 1 else 1)
        fp, base = prompt + out + SLACK, prompt + r.num_output_tokens + SLACK
        late: _Item = ((0, arrival, 0.0, rid), rid, False, rem, fp, base)
        fresh: _Item = ((1, float(rem), arrival, rid), rid, False, rem, fp, base)
        self.gen = gen = self.gen + 1
        overdue = now - arrival >= threshold and (self.turns is None or self.turns.turned(rid))
        ns = self.ns(r) if self.ns is not None else 0
        self.waiting_ns += ns
        self.live[rid] = _Entry(gen, arrival, threshold, fresh, late, overdue, ns, r)
        if self.prefix:
            heapq.heappush(self.byarr, (arrival, rid, gen, late))
            if overdue:
                heapq.heappush(self.newest, (-arrival, rid, gen))
        if overdue:
            heapq.heappush(self.late, (arrival, rid, gen, late))
            if self.ns is not None:
                heapq.heappush(self.late_fresh, (fresh[0][1], arrival, rid, gen, fresh))
        else:
            heapq.heappush(self.fresh, (fresh[0][1], arrival, rid, gen, fresh))
            heapq.heappush(self.due, (arrival + threshold, gen, rid))
        heapq.heappush(self.small, (prompt + out, gen, rid))

    def promote(self, now: float) -> None:
        """Move the requests overdue at ``now`` (``now - arrival >= k * s_i`` and, with
        the FCFS turn, the turn reached, tested as ``decide_full`` tests them) to the
        overdue heap. Candidates come from the heap of ``arrival + k * s_i``, with a
        margin far above its rounding, then from the heap of thresholds ``theta_i`` (the
        clock only grows, so each entry moves at most twice)."""
        due, live, turns = self.due, self.live, self.turns
        lim = now + 1e-6 * (1.0 + abs(now))
        retry = []
        while due and due[0][0] <= lim:
            item = heapq.heappop(due)
            e = live.get(item[2])
            if e is None or e.gen != item[1] or e.overdue:
                continue
            if now - e.arrival >= e.threshold:
                if turns is None or turns.turned(item[2]):
                    self._overdue(e, item[2])
                else:
                    heapq.heappush(self.turn_wait, (turns.threshold(item[2]), e.gen, item[2]))
            else:
                retry.append(item)
        for item in retry:
            heapq.heappush(due, item)
        wait = self.turn_wait
        while wait and turns is not None and wait[0][0] <= turns.admitted:
            _, gen, rid = heapq.heappop(wait)
            e = live.get(rid)
            if e is not None and e.gen == gen and not e.overdue:
                self._overdue(e, rid)

    def _overdue(self, e: _Entry, rid: str) -> None:
        e.overdue = True
        heapq.heappush(self.late, (e.arrival, rid, e.gen, e.late))
        if self.ns is not None:
            heapq.heappush(self.late_fresh, (e.fresh[0][1], e.arrival, rid, e.gen, e.fresh))
        if self.prefix:
            heapq.heappush(self.newest, (-e.arrival, rid, e.gen))

    def min_footprint(self, default: int) -> int:
        """The smallest prompt + outputs waiting (``default`` if none)."""
        small, live = self.small, self.live
        while small:
            fp, gen, rid = small[0]
            e = live.get(rid)
            if e is not None and e.gen == gen:
                return fp
            heapq.heappop(small)
        return default

    def newest_overdue(self) -> float:
        """The newest arrival among the overdue waiting requests (-inf: none; ``prefix``
        only)."""
        newest, live = self.newest, self.live
        while newest:
            a, rid, gen = newest[0]
            e = live.get(rid)
            if e is not None and e.gen == gen:
                return -a
            heapq.heappop(newest)
        return -math.inf

    def in_order(self, newest: float = -math.inf, floor: float = 0.0) -> Iterator[_Item]:
        """The waiting items in the policy's order (overdue, then fresh; with the overdue
        prefix up to ``newest``, every one that arrived no later, then the later fresh
        ones), taken off the heaps as they are read; ``restore`` puts them back. With a
        drain floor (``floor`` > 0) overdue means also ``now - arrival >= floor``: a
        prefix of the overdue heap's arrival order; the overdue requests past it are
        fresh, merged from ``late_fresh`` into the fresh ones by the fresh key."""
        live, popped, pop = self.live, self.popped, heapq.heappop
        if floor > 0:
            yield from self._in_order_floor(floor)
            return
        if newest > -math.inf:
            byarr = self.byarr
            while byarr and byarr[0][0] <= newest:
                b = pop(byarr)
                e = live.get(b[1])
                if e is not None and e.gen == b[2]:
                    popped.append((2, b))
                    yield b[3]
        else:
            late = self.late
            while late:
                a = pop(late)
                e = live.get(a[1])
                if e is not None and e.gen == a[2]:  # (overdue stays overdue)
                    popped.append((1, a))
                    yield a[3]
        fresh = self.fresh
        while fresh:
            f = pop(fresh)
            e = live.get(f[2])
            if e is not None and e.gen == f[3] and not e.overdue:
                popped.append((0, f))
                if f[1] > newest:  # (else listed in the prefix: kept, not yielded twice)
                    yield f[4]

    def _in_order_floor(self, floor: float) -> Iterator[_Item]:
        """``in_order`` under a drain floor (no overdue prefix: ``Ordered.decide``)."""
        live, popped, pop, now = self.live, self.popped, heapq.heappop, self.now
        late = self.late
        while late:  # overdue by both: arrival order, while the floor's test holds
            a = late[0]
            e = live.get(a[1])
            if e is None or e.gen != a[2]:
                pop(late)  # stale: dropped
                continue
            if not now - a[0] >= floor:
                break
            popped.append((1, pop(late)))
            yield a[3]
        fresh, lf = self.fresh, self.late_fresh
        while True:  # then both fresh heaps by the fresh key, merged
            while fresh:
                f = fresh[0]
                e = live.get(f[2])
                if e is not None and e.gen == f[3] and not e.overdue:
                    break
                pop(fresh)  # stale, or overdue now (then in the late heaps): dropped
            while lf:
                g = lf[0]
                e = live.get(g[2])
                if e is None or e.gen != g[3]:
                    pop(lf)  # stale: dropped
                elif now - g[1] >= floor:
                    popped.append((3, pop(lf)))  # yielded above, from the late heap
                else:
                    break
            if fresh and (not lf or fresh[0][:3] < lf[0][:3]):
                f = pop(fresh)
                popped.append((0, f))
                yield f[4]
            elif lf:
                g = pop(lf)
                popped.append((3, g))
                yield g[4]
            else:
                return

    def restore(self) -> None:
        push, fresh, late, byarr = heapq.heappush, self.fresh, self.late, self.byarr
        for kind, entry in self.popped:
            if kind == 0:
                push(fresh, entry)  # type: ignore[arg-type]
            elif kind == 1:
                push(late, entry)  # type: ignore[arg-type]
            elif kind == 2:
                push(byarr, entry)  # type: ignore[arg-type]
            else:
                push(self.late_fresh, entry)  # type: ignore[arg-type]
        self.popped.clear()
