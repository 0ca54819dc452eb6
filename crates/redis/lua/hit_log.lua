-- The hit log shared by the sliding log and the burst tiers: a port of
-- crates/core/src/algorithms/hit_log.rs.
--
-- A log is a table {t=, c=, h=, n=, base=}: entries h..n (empty when
-- n < h) with t[i] the entry's relative time and c[i] the cumulative count
-- of hits logged up to and including it; base is the cumulative count
-- before entry h. Dropping the oldest entry moves h instead of shifting
-- the arrays, so pruning a long log stays linear.
--
-- Stored (by encode, read by decode): for each entry, oldest first, its
-- time (T.put) and its own number of hits. Decoding restarts the
-- cumulative counts at 0, so within one script they stay below twice the
-- limit (one push adds at most `keep` hits), far below 2^53. That is why
-- the core's REBASE_AT bookkeeping has no counterpart here: it changes
-- how counts are written, never an answer.
--
-- Two top-level locals, for the chunk's 200. The functions are defined by
-- hit_log_load, which the loaders of the algorithms that use the log call
-- (see LOADERS in prelude.lua).
local HitLog = {}
local function hit_log_load()
  if HitLog.new then return end

  function HitLog.new()
    return { t = {}, c = {}, h = 1, n = 0, base = 0 }
  end

  -- A log of `count` entries stored from v[at] on, relative to base second
  -- `base`; also returns the index after them.
  function HitLog.decode(v, at, count, base)
    local log = HitLog.new()
    local cum = 0
    for i = 1, count do
      cum = cum + v[at + 1]
      log.t[i] = T.get(v[at], base)
      log.c[i] = cum
      at = at + 2
    end
    log.n = count
    return log, at
  end

  -- Appends the log's entries to `out` in decode's layout; returns how many.
  function HitLog.encode(log, out)
    local prev = log.base
    for i = log.h, log.n do
      out[#out + 1] = T.put(log.t[i])
      out[#out + 1] = log.c[i] - prev
      prev = log.c[i]
    end
    return HitLog.len(log)
  end

  function HitLog.len(log)
    return log.n - log.h + 1
  end

  function HitLog.is_empty(log)
    return log.n < log.h
  end

  function HitLog.last_cum(log)
    if log.n < log.h then return log.base end
    return log.c[log.n]
  end

  -- The cumulative count before entry i (h <= i <= n + 1).
  function HitLog.cum_before(log, i)
    if i > log.h then return log.c[i - 1] end
    return log.base
  end

  function HitLog.total(log)
    return HitLog.last_cum(log) - log.base
  end

  -- The first entry whose time is at or after `from` (n + 1 if none): the
  -- core's partition_point(t < from).
  function HitLog.first_since(log, from)
    local lo, hi = log.h, log.n + 1
    while lo < hi do
      local mid = floor((lo + hi) / 2)
      if log.t[mid] < from then lo = mid + 1 else hi = mid end
    end
    return lo
  end

  -- Hits at or after `from`.
  function HitLog.count_since(log, from)
    local i = HitLog.first_since(log, from)
    return HitLog.last_cum(log) - HitLog.cum_before(log, i)
  end

  -- Forgets hits before `from`.
  function HitLog.prune(log, from)
    while log.h <= log.n and log.t[log.h] < from do
      log.base = log.c[log.h]
      log.h = log.h + 1
    end
    if log.n < log.h then log.base = 0 end
  end

  -- Drops the oldest hits until at most `keep` remain.
  function HitLog.trim(log, keep)
    while HitLog.total(log) > keep do
      local excess = HitLog.total(log) - keep
      if log.n < log.h then break end
      local first = log.c[log.h]
      if first - log.base > excess then
        -- Part of the oldest entry goes.
        log.base = log.base + excess
      else
        log.base = first
        log.h = log.h + 1
      end
    end
    if log.n < log.h then log.base = 0 end
  end

  -- Time of the newest hit, or nil.
  function HitLog.newest(log)
    if log.n < log.h then return nil end
    return log.t[log.n]
  end

  -- Records `n` hits at `at`, keeping only the newest `keep` hits. A time
  -- before the newest entry is recorded at the newest entry's time (the
  -- log stays in time order; the hit counts longer, never less).
  function HitLog.push(log, at, n, keep)
    n = min(n, keep)
    if n == 0 then return end
    local newest = HitLog.newest(log)
    if newest and newest > at then at = newest end
    HitLog.trim(log, keep - n)
    local cum = HitLog.last_cum(log) + n
    if log.n >= log.h and log.t[log.n] == at then
      log.c[log.n] = cum
    else
      log.n = log.n + 1
      log.t[log.n] = at
      log.c[log.n] = cum
    end
  end

  -- Forgets up to `n` of the newest hits (a refund); returns how many.
  function HitLog.take_newest(log, n)
    local left = n
    while left > 0 and log.n >= log.h do
      local in_entry = log.c[log.n] - HitLog.cum_before(log, log.n)
      if in_entry <= left then
        left = left - in_entry
        log.n = log.n - 1
      else
        log.c[log.n] = log.c[log.n] - left
        left = 0
      end
    end
    if log.n < log.h then log.base = 0 end
    return n - left
  end

  -- The time of the entry that must leave a window before at most
  -- `allowed` hits remain in it (walking from the newest hit, the first
  -- entry that takes the count past `allowed`), or nil when at most
  -- `allowed` hits are logged at all.
  function HitLog.blocking_entry(log, allowed)
    if HitLog.total(log) <= allowed then return nil end
    local target = HitLog.last_cum(log) - allowed
    local lo, hi = log.h, log.n + 1
    while lo < hi do
      local mid = floor((lo + hi) / 2)
      if log.c[mid] < target then lo = mid + 1 else hi = mid end
    end
    return log.t[lo]
  end
end
