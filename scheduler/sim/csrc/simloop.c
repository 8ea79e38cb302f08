/* The simulator's event loop in C: `_run_solo` and `_run_shared` of scheduler/simulator.py,
 * step for step, so that both give bit-identical predictions.
 *
 * Inputs are the flat columns of a simulator graph (op i is position i). Ready ops of a
 * device sit in a binary heap ordered by their dispatch keys, compared column by column
 * as Python compares the key tuples (the position last); events are ordered by
 * (time, priority, seq), seq unique, as the Python heap entries are. Any correct heap
 * pops a total order alike, so the two agree exactly.
 *
 * Arithmetic is the Python code's, operation by operation, in double precision; the
 * library is built with -ffp-contract=off so that no multiply-add is fused (a fused one
 * rounds once where Python rounds twice).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double t;
    int64_t seq;
    int32_t pr;
    int32_t op;
} event_t;

typedef struct {
    const int32_t *pr;
    const double *issued;
    const int64_t *oid;
} keys_t;

typedef struct { /* a device's ready ops: a heap of op positions in a shared buffer */
    int32_t *a;
    int32_t size;
} ready_t;

typedef struct {
    event_t *a;
    int64_t size, cap;
} events_t;

static inline int key_lt(const keys_t *k, int32_t a, int32_t b) {
    if (k->pr[a] != k->pr[b]) return k->pr[a] < k->pr[b];
    if (k->issued[a] != k->issued[b]) return k->issued[a] < k->issued[b];
    if (k->oid[a] != k->oid[b]) return k->oid[a] < k->oid[b];
    return a < b;
}

static void ready_push(const keys_t *k, ready_t *h, int32_t op) {
    int32_t i = h->size++;
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!key_lt(k, op, h->a[p])) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = op;
}

static void ready_sift_down(const keys_t *k, ready_t *h, int32_t op) {
    int32_t i = 0, n = h->size;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && key_lt(k, h->a[c + 1], h->a[c])) c++;
        if (!key_lt(k, h->a[c], op)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    h->a[i] = op;
}

static int32_t ready_pop(const keys_t *k, ready_t *h) {
    int32_t top = h->a[0];
    int32_t last = h->a[--h->size];
    if (h->size > 0) ready_sift_down(k, h, last);
    return top;
}

/* heapq.heappushpop: `op` itself when it comes first (the heap untouched), else the top */
static int32_t ready_pushpop(const keys_t *k, ready_t *h, int32_t op) {
    if (h->size == 0 || key_lt(k, op, h->a[0])) return op;
    int32_t top = h->a[0];
    ready_sift_down(k, h, op);
    return top;
}

static inline int ev_lt(const event_t *a, const event_t *b) {
    if (a->t != b->t) return a->t < b->t;
    if (a->pr != b->pr) return a->pr < b->pr;
    return a->seq < b->seq;
}

static int ev_push(events_t *h, double t, int32_t pr, int64_t seq, int32_t op) {
    if (h->size == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 64;
        event_t *a = realloc(h->a, (size_t)cap * sizeof(event_t));
        if (a == NULL) return -1;
        h->a = a;
        h->cap = cap;
    }
    event_t e = {t, seq, pr, op};
    int64_t i = h->size++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!ev_lt(&e, &h->a[p])) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = e;
    return 0;
}

static event_t ev_pop(events_t *h) {
    event_t top = h->a[0], last = h->a[--h->size];
    int64_t i = 0, n = h->size;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && ev_lt(&h->a[c + 1], &h->a[c])) c++;
        if (!ev_lt(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (n > 0) h->a[i] = last;
    return top;
}

/* The graph, the co-location model and the run's state, shared by the loop's steps. */
typedef struct {
    int32_t n, n_dev, n_hosts, n_cls;
    const int32_t *dev, *host, *cls;
    int32_t *succ_ptr, *succ_idx, *waiting; /* successors per op (CSR), unfinished deps */
    keys_t keys;
    const double *dur, *excess;
    const int64_t *mem_of;
    int64_t base;
    int64_t *mem, *peak;
    double *start, *finish;
    int32_t *rank;
    /* run state */
    ready_t *ready;
    events_t events;
    int64_t seq, done;
    int32_t *running, *woken, n_woken;
    double *rem, *last, *slow;
    int64_t *live, *digit, *code, *timed;
    int32_t *fresh, n_fresh, *changed, n_changed, *todo;
    double *fac;                /* the slowdowns of the code `factors` was last given */
    double *table;              /* per code, its slowdowns (where the codes are few), */
    uint8_t *known;             /* and whether they were computed yet */
    int64_t fac_code, n_codes;  /* the code `fac` holds (-1: none yet); codes in `table` */
} sim_t;

/* `Interference.factor` for every class on a host whose running classes are `code`
 * (then 1.0 at index n_cls, for ops of no class), at s->fac; kept per code in `table`
 * where the codes are few (as `Interference.factors` keeps them), else while the code
 * stays the same (a chain going on meets the same code at each of its ops). */
static void factors(sim_t *s, int64_t code) {
    if (code == s->fac_code) return;
    s->fac_code = code;
    if (code < s->n_codes) {
        s->fac = s->table + code * (s->n_cls + 1);
        if (s->known[code]) return;
        s->known[code] = 1;
    }
    int64_t counts[64];
    int64_t p = 1;
    for (int32_t c = 0; c < s->n_cls; c++) {
        counts[c] = code / p % s->base;
        p *= s->base;
    }
    for (int32_t k = 0; k < s->n_cls; k++) {
        const double *row = s->excess + (int64_t)k * s->n_cls;
        double f = 1.0;
        for (int32_t c = 0; c < s->n_cls; c++)
            if (counts[c]) f += row[c] * (double)(c == k ? counts[c] - 1 : counts[c]);
        s->fac[k] = f;
    }
    s->fac[s->n_cls] = 1.0;
}

static inline int32_t cls_of(const sim_t *s, int32_t j) {
    return s->cls[j] < 0 ? s->n_cls : s->cls[j];
}

/* `_release`: op `i` on device `d` ended; fills s->woken, returns the ready successor on `d`
 * itself (-1 if none; only an op's one successor is returned so, as `nxt` there). */
static int32_t release(sim_t *s, int32_t i, int32_t d) {
    int32_t a = s->succ_ptr[i], b = s->succ_ptr[i + 1];
    s->n_woken = 1;
    s->woken[0] = d;
    if (b - a == 1) {
        int32_t x = s->succ_idx[a];
        if (--s->waiting[x]) return -1;
        int32_t e = s->dev[x];
        if (e == d) return x;
        ready_push(&s->keys, &s->ready[e], x);
        s->woken[s->n_woken++] = e;
        return -1;
    }
    for (int32_t k = a; k < b; k++) {
        int32_t y = s->succ_idx[k];
        if (--s->waiting[y] == 0) {
            ready_push(&s->keys, &s->ready[s->dev[y]], y);
            s->woken[s->n_woken++] = s->dev[y];
        }
    }
    return -1;
}

static inline void account(sim_t *s, int32_t d, int32_t j) {
    s->mem[d] += s->mem_of[j];
    if (s->mem[d] > s->peak[d]) s->peak[d] = s->mem[d];
}

static inline int push_timed(sim_t *s, int32_t j, double t) {
    s->live[j] = ++s->seq;
    return ev_push(&s->events, t, s->keys.pr[j], s->seq, j);
}

static inline void mark_changed(sim_t *s, int32_t h) {
    for (int32_t k = 0; k < s->n_changed; k++)
        if (s->changed[k] == h) return;
    s->changed[s->n_changed++] = h;
}

/* Ops started on shared hosts since the last re-timing, in order (each op starts once). */
static inline void add_fresh(sim_t *s, int32_t j) { s->fresh[s->n_fresh++] = j; }

/* Re-time the hosts whose running classes changed at `t` (the top of `_run_shared`'s loop). */
static int retime(sim_t *s, double t) {
    for (int32_t a = 1; a < s->n_changed; a++) { /* insertion sort: a handful of hosts */
        int32_t h = s->changed[a], b = a;
        for (; b > 0 && s->changed[b - 1] > h; b--) s->changed[b] = s->changed[b - 1];
        s->changed[b] = h;
    }
    for (int32_t a = 0; a < s->n_changed; a++) {
        int32_t h = s->changed[a], n_todo = 0;
        int64_t c = s->code[h];
        if (c != s->timed[h]) {
            s->timed[h] = c;
            for (int32_t d = 0; d < s->n_dev; d++)
                if (s->host[d] == h && s->running[d] >= 0) s->todo[n_todo++] = s->running[d];
        } else {
            for (int32_t k = 0; k < s->n_fresh; k++) { /* this host's, by device (stable) */
                int32_t j = s->fresh[k];
                if (s->host[s->dev[j]] != h) continue;
                int32_t b = n_todo++;
                for (; b > 0 && s->dev[s->todo[b - 1]] > s->dev[j]; b--)
                    s->todo[b] = s->todo[b - 1];
                s->todo[b] = j;
            }
        }
        if (n_todo) factors(s, c);
        for (int32_t k = 0; k < n_todo; k++) {
            int32_t j = s->todo[k];
            double f = s->fac[cls_of(s, j)];
            if (f != s->slow[j]) {
                if (s->slow[j] > 0.0) {
                    double left = s->rem[j] - (t - s->last[j]) / s->slow[j];
                    s->rem[j] = left > 0.0 ? left : 0.0;
                }
                s->last[j] = t;
                s->slow[j] = f;
                if (push_timed(s, j, t + s->rem[j] * f)) return -1;
            }
        }
    }
    s->n_changed = s->n_fresh = 0;
    return 0;
}

/* Start op `j` on idle device `d` at `t` (a shared host's ops wait for the re-timing). */
static int begin(sim_t *s, int32_t d, int32_t j, double t) {
    s->running[d] = j;
    s->start[j] = t;
    account(s, d, j);
    int32_t h = s->host[d];
    if (h < 0) return push_timed(s, j, t + s->dur[j]);
    s->code[h] += s->digit[j];
    add_fresh(s, j);
    mark_changed(s, h);
    return 0;
}

/* `_starts` and the start of both loops: the ops running at `now`, then on each idle device
 * its first ready op. `solo`: running ops end at max(now, start + dur) (`_run_solo`). */
static int starts(sim_t *s, double now, const double *ostart, int32_t solo) {
    for (int32_t i = 0; i < s->n; i++) {
        if (!isnan(ostart[i])) {
            int32_t d = s->dev[i], h = s->host[d];
            double left = ostart[i] + s->dur[i] - now;
            left = left > 0.0 ? left : 0.0;
            s->start[i] = ostart[i];
            s->running[d] = i;
            account(s, d, i);
            if (solo) {
                double e = ostart[i] + s->dur[i];
                if (push_timed(s, i, e > now ? e : now)) return -1;
            } else if (h < 0) {
                if (push_timed(s, i, now + left)) return -1;
            } else {
                s->rem[i] = left;
                s->code[h] += s->digit[i];
                add_fresh(s, i);
                mark_changed(s, h);
            }
        } else if (s->waiting[i] == 0) {
            ready_push(&s->keys, &s->ready[s->dev[i]], i);
        }
    }
    for (int32_t d = 0; d < s->n_dev; d++)
        if (s->running[d] < 0 && s->ready[d].size > 0)
            if (begin(s, d, ready_pop(&s->keys, &s->ready[d]), now)) return -1;
    return 0;
}

/* The common case on a shared host: op `i` ended on `d` and the next starts there alone. */
static int chain_on(sim_t *s, int32_t i, int32_t d, int32_t mine, double t) {
    int32_t h = s->host[d];
    int32_t j = mine >= 0 ? ready_pushpop(&s->keys, &s->ready[d], mine)
                          : ready_pop(&s->keys, &s->ready[d]);
    s->running[d] = j;
    s->start[j] = t;
    account(s, d, j);
    if (s->digit[j] == s->digit[i]) { /* same class: the host's slowdowns stay */
        factors(s, s->code[h]);
        double f = s->fac[cls_of(s, j)];
        s->last[j] = t;
        s->slow[j] = f;
        return push_timed(s, j, t + s->rem[j] * f);
    }
    s->code[h] += s->digit[j] - s->digit[i];
    add_fresh(s, j);
    s->changed[s->n_changed++] = h;
    return 0;
}

static int loop(sim_t *s, double now, double *end) {
    double t = now;
    *end = now;
    for (;;) {
        if (s->n_changed && retime(s, t)) return -1;
        event_t e;
        int found = 0;
        while (s->events.size > 0) {
            e = ev_pop(&s->events);
            if (s->live[e.op] == e.seq) {
                found = 1;
                break;
            }
        }
        if (!found) return 0;
        int32_t i = e.op, d = s->dev[i];
        t = *end = e.t;
        s->running[d] = -1;
        s->finish[i] = t;
        s->rank[i] = (int32_t)s->done++;
        s->mem[d] -= s->mem_of[i];
        int32_t mine = release(s, i, d);
        int32_t h = s->host[d];
        if (h >= 0 && s->n_woken == 1 && (mine >= 0 || s->ready[d].size > 0)) {
            if (chain_on(s, i, d, mine, t)) return -1;
            continue;
        }
        if (h >= 0) {
            s->code[h] -= s->digit[i];
            s->changed[s->n_changed++] = h;
        }
        for (int32_t k = 0; k < s->n_woken; k++) {
            int32_t w = s->woken[k], j;
            if (s->running[w] >= 0) continue;
            if (mine >= 0) {
                j = ready_pushpop(&s->keys, &s->ready[w], mine);
                mine = -1;
            } else if (s->ready[w].size > 0) {
                j = ready_pop(&s->keys, &s->ready[w]);
            } else {
                continue;
            }
            if (begin(s, w, j, t)) return -1;
        }
    }
}

/* One zeroed block carved into the run's arrays: `carve` with no block sizes them up. */
typedef struct {
    char *block;
    size_t used;
} arena_t;

static void *carve(arena_t *a, size_t count, size_t size) {
    void *p = a->block ? a->block + a->used : NULL;
    a->used += (count * size + 7) & ~(size_t)7;
    return p;
}

/* Op id -> position, open addressing; a later position of an id replaces an earlier one
 * (as a dict built in order). */
typedef struct {
    int64_t *ids;
    int32_t *pos;
    uint64_t mask;
} index_t;

static inline uint64_t slot_of(const index_t *x, int64_t id) {
    uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ull;
    return (h ^ (h >> 29)) & x->mask;
}

static void index_put(index_t *x, int64_t id, int32_t pos) {
    uint64_t k = slot_of(x, id);
    while (x->pos[k] >= 0 && x->ids[k] != id) k = (k + 1) & x->mask;
    x->ids[k] = id;
    x->pos[k] = pos;
}

static int32_t index_get(const index_t *x, int64_t id) {
    for (uint64_t k = slot_of(x, id); x->pos[k] >= 0; k = (k + 1) & x->mask)
        if (x->ids[k] == id) return x->pos[k];
    return -1;
}

/* Deps as positions (-1: not in the graph): ops before `scope` look among themselves (a
 * snapshot's graph, built before a candidate extends it), the others among all. */
static void resolve(index_t *x, const int64_t *oid, int32_t n, int32_t scope,
                    const int32_t *dep_ptr, const int64_t *dep_ids, int32_t *dep_pos) {
    int32_t from = 0;
    for (int32_t upto = scope; from < n; upto = n) {
        for (int32_t i = from; i < upto; i++) index_put(x, oid[i], i);
        for (int32_t k = dep_ptr[from]; k < dep_ptr[upto]; k++)
            dep_pos[k] = index_get(x, dep_ids[k]);
        from = upto;
    }
}

/* Each op's successors, in the order `_build` links them (by op, then by dep), and its
 * unfinished deps; the ready heaps' room per device. */
static void link(sim_t *s, const int32_t *dep_ptr, const int32_t *dep_pos, int32_t *heaps,
                 int32_t *count, int32_t *cursor) {
    for (int32_t i = 0; i < s->n; i++) {
        for (int32_t k = dep_ptr[i]; k < dep_ptr[i + 1]; k++) {
            if (dep_pos[k] < 0) continue;
            s->waiting[i]++;
            s->succ_ptr[dep_pos[k] + 1]++;
        }
        count[s->dev[i]]++;
    }
    int32_t off = 0;
    for (int32_t d = 0; d < s->n_dev; d++) {
        s->ready[d].a = heaps + off;
        off += count[d];
        s->running[d] = -1;
    }
    for (int32_t i = 0; i < s->n; i++) s->succ_ptr[i + 1] += s->succ_ptr[i];
    memcpy(cursor, s->succ_ptr, (size_t)s->n * sizeof(int32_t));
    for (int32_t i = 0; i < s->n; i++)
        for (int32_t k = dep_ptr[i]; k < dep_ptr[i + 1]; k++)
            if (dep_pos[k] >= 0) s->succ_idx[cursor[dep_pos[k]]++] = i;
}

/* Simulate the graph from `now`. Per op: `dev`, its deps (op ids:
 * dep_ids[dep_ptr[i]:dep_ptr[i + 1]]; those not in the graph are done, and ops before
 * `scope` look for theirs among themselves), the key columns `pr`, `issued`, `oid`, `dur`,
 * `mem_of` and `cls` (-1: none); the ops running at `now`, `run_idx` (ascending) with
 * their starts; `host` per device (-1: alone; `solo`: every device alone, as
 * `_run_solo`), `excess` n_cls x n_cls, `base` the digit base of a host's code. `mem` and
 * `peak` per device are updated; `start`, `finish` (NaN: none) and `rank` (order of
 * completion, -1: none) are filled per op; `*end` is when the last op ends. Returns how
 * many ops finished, or a negative code (-1: out of memory; -3: arguments miscounted). */
static int64_t sim_run(int32_t n, int32_t n_dev, double now, int32_t solo, const int32_t *dev,
                const int32_t *dep_ptr, const int64_t *dep_ids, int32_t scope,
                const int32_t *pr,
                const double *issued, const int64_t *oid, const double *dur,
                const int64_t *mem_of, int32_t n_running, const int32_t *run_idx,
                const double *run_start, const int32_t *host, int32_t n_hosts,
                const int32_t *cls, int64_t base, int32_t n_cls, const double *excess,
                int64_t *mem, int64_t *peak, double *start, double *finish, int32_t *rank,
                double *end) {
    if (n_cls > 63) return -2; /* a host's code has one digit per class */
    sim_t s = {.n = n, .n_dev = n_dev, .n_hosts = solo ? 0 : n_hosts, .n_cls = n_cls,
               .dev = dev, .host = host, .cls = cls, .keys = {pr, issued, oid}, .dur = dur,
               .excess = excess, .mem_of = mem_of, .base = base, .mem = mem, .peak = peak,
               .start = start, .finish = finish, .rank = rank, .fac_code = -1};
    size_t un = (size_t)n, ud = (size_t)n_dev, uh = (size_t)s.n_hosts;
    s.n_codes = 1; /* base ** n_cls where that is few (81 codes: 2 devices, 4 classes) */
    for (int32_t c = 0; c < n_cls && !solo && s.n_codes <= 1024; c++) s.n_codes *= base;
    if (solo || s.n_codes > 1024) s.n_codes = 0;
    size_t un_deps = (size_t)dep_ptr[n], slots = 2;
    while (slots < 2 * un) slots *= 2;
    int32_t *heaps = NULL, *fill = NULL, *alone = NULL, *dep_pos = NULL;
    double *ostart = NULL;
    index_t x = {NULL, NULL, slots - 1};
    arena_t a = {NULL, 0};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && (a.block = calloc(1, a.used)) == NULL) return -1;
        a.used = 0;
        heaps = carve(&a, un, sizeof(int32_t));
        fill = carve(&a, un + ud, sizeof(int32_t));
        alone = carve(&a, ud, sizeof(int32_t));
        ostart = carve(&a, un, sizeof(double));
        x.ids = carve(&a, slots, sizeof(int64_t));
        x.pos = carve(&a, slots, sizeof(int32_t));
        dep_pos = carve(&a, un_deps, sizeof(int32_t));
        s.succ_ptr = carve(&a, un + 1, sizeof(int32_t));
        s.succ_idx = carve(&a, un_deps, sizeof(int32_t));
        s.waiting = carve(&a, un, sizeof(int32_t));
        s.ready = carve(&a, ud, sizeof(ready_t));
        s.running = carve(&a, ud, sizeof(int32_t));
        s.woken = carve(&a, un + 1, sizeof(int32_t)); /* a device per successor */
        s.rem = carve(&a, un, sizeof(double));
        s.last = carve(&a, un, sizeof(double));
        s.slow = carve(&a, un, sizeof(double));
        s.live = carve(&a, un, sizeof(int64_t));
        s.digit = carve(&a, un, sizeof(int64_t));
        s.code = carve(&a, uh, sizeof(int64_t));
        s.timed = carve(&a, uh, sizeof(int64_t));
        s.fresh = carve(&a, un, sizeof(int32_t));
        s.changed = carve(&a, uh, sizeof(int32_t));
        s.todo = carve(&a, un + ud, sizeof(int32_t));
        s.fac = carve(&a, (size_t)n_cls + 1, sizeof(double));
        s.table = carve(&a, (size_t)s.n_codes * ((size_t)n_cls + 1), sizeof(double));
        s.known = carve(&a, (size_t)s.n_codes, sizeof(uint8_t));
    }
    if (solo) {
        for (int32_t d = 0; d < n_dev; d++) alone[d] = -1;
        s.host = alone;
    }
    memset(x.pos, 0xff, slots * sizeof(int32_t)); /* every slot free (-1) */
    resolve(&x, oid, n, scope, dep_ptr, dep_ids, dep_pos);
    link(&s, dep_ptr, dep_pos, heaps, fill + n, fill);
    int64_t powers[64];
    powers[0] = 1;
    for (int32_t c = 1; c < n_cls; c++) powers[c] = powers[c - 1] * base;
    for (int32_t i = 0; i < n; i++) {
        start[i] = finish[i] = ostart[i] = NAN;
        rank[i] = -1;
        s.rem[i] = dur[i];
        s.live[i] = -1;
        s.digit[i] = solo || cls[i] < 0 ? 0 : powers[cls[i]];
    }
    for (int32_t k = 0; k < n_running; k++) ostart[run_idx[k]] = run_start[k];
    int64_t rc = starts(&s, now, ostart, solo) || loop(&s, now, end) ? -1 : s.done;
    free(a.block), free(s.events.a);
    return rc;
}

/* `sim_run`'s arguments packed into one array by `scheduler.simloop.run` (pointers as
 * addresses), in this order: ctypes converts 28 arguments in about 3 us, one in 0.3. */
enum { A_N, A_N_DEV, A_SOLO, A_DEV, A_DEP_PTR, A_DEP_IDS, A_SCOPE, A_PR, A_ISSUED, A_OID,
       A_DUR, A_MEM_OF, A_N_RUNNING, A_RUN_IDX, A_RUN_START, A_HOST, A_N_HOSTS, A_CLS, A_BASE,
       A_N_CLS, A_EXCESS, A_MEM, A_PEAK, A_START, A_FINISH, A_RANK, A_COUNT };

#define I32(k) ((int32_t)a[k])
#define PTR(T, k) ((T *)(intptr_t)a[k])

int64_t sim_run_packed(const int64_t *a, int64_t count, double now, double *end) {
    if (count != A_COUNT) return -3;
    return sim_run(I32(A_N), I32(A_N_DEV), now, I32(A_SOLO), PTR(const int32_t, A_DEV),
                   PTR(const int32_t, A_DEP_PTR), PTR(const int64_t, A_DEP_IDS), I32(A_SCOPE),
                   PTR(const int32_t, A_PR), PTR(const double, A_ISSUED),
                   PTR(const int64_t, A_OID), PTR(const double, A_DUR),
                   PTR(const int64_t, A_MEM_OF), I32(A_N_RUNNING), PTR(const int32_t, A_RUN_IDX),
                   PTR(const double, A_RUN_START), PTR(const int32_t, A_HOST), I32(A_N_HOSTS),
                   PTR(const int32_t, A_CLS), a[A_BASE], I32(A_N_CLS),
                   PTR(const double, A_EXCESS), PTR(int64_t, A_MEM), PTR(int64_t, A_PEAK),
                   PTR(double, A_START), PTR(double, A_FINISH), PTR(int32_t, A_RANK), end);
}
