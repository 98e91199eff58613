/*
 * gloo_bench.cc - Gloo's ring allreduce and ring allgather over its TCP
 * transport: the Gloo peer fsdpc-bench's tcp backend is compared with.
 *
 *   mpiexec.mpich -n 2 gloo_bench --store /tmp/gloo-run1 --op all \
 *       --sizes 4,4K,1M,64M --iters 20 --csv out.csv
 *
 * Built only where Debian's libgloo-dev is installed (tests/peers/Makefile);
 * never a dependency of fsdpc. mpiexec only launches the processes: rank and
 * size come from PMI_RANK/PMI_SIZE (or RANK/WORLD_SIZE, or --rank/--size),
 * rendezvous is Gloo's FileStore in a fresh directory, and the pairs are
 * gloo::transport::tcp on loopback. gloo::AllreduceRing and
 * gloo::AllgatherRing are the classic algorithms PyTorch's Gloo process group
 * was built on; each is constructed once per size (its scratch buffers are
 * allocated there) and run repeatedly. Measurement as in fsdpc-bench:
 * warm-up, barrier, timed iterations, per-rank mean/median/min, max over
 * ranks, one checked run afterwards. Allreduce is in place (Gloo's API);
 * allgather is out of place.
 */
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "peer_common.h"

namespace {

struct GlooOpts {
    int rank = -1;
    int size = -1;
    std::string store;
    std::string host = "127.0.0.1";
    bool allreduce = true;
    bool allgather = false;
    size_t sizes[PEER_MAX_SIZES];
    int nsizes = 0;
    int iters = 20;
    int warmup = 5;
    int timeout_s = 120;
    std::string impl = "gloo-ring";
    std::string csv;
};

int envInt(const char *a, const char *b)
{
    const char *s = getenv(a);
    if (!s || !*s) {
        s = getenv(b);
    }
    return s && *s ? atoi(s) : -1;
}

void usage()
{
    fprintf(stderr,
            "usage: gloo_bench --store DIR [--op allreduce|allgather|all] [--sizes LIST |\n"
            "       --min B --max B [--step-factor F]] [--iters N] [--warmup N] [--host ADDR]\n"
            "       [--rank R --size N] [--timeout S] [--impl LABEL] [--csv FILE]\n");
}

bool parse(int argc, char **argv, GlooOpts *o)
{
    const char *list = nullptr;
    size_t min = 4, max = size_t(256) << 20, factor = 2;
    for (int i = 1; i < argc; i += 2) {
        std::string a = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "gloo_bench: %s needs a value\n", a.c_str());
            return false;
        }
        const char *v = argv[i + 1];
        if (a == "--op") {
            std::string s = v;
            o->allreduce = s == "all" || s.find("allreduce") != std::string::npos;
            o->allgather = s == "all" || s.find("allgather") != std::string::npos;
        } else if (a == "--store") {
            o->store = v;
        } else if (a == "--host") {
            o->host = v;
        } else if (a == "--sizes") {
            list = v;
        } else if (a == "--min") {
            min = peer_parse_size(v);
        } else if (a == "--max") {
            max = peer_parse_size(v);
        } else if (a == "--step-factor") {
            factor = size_t(atol(v));
        } else if (a == "--iters") {
            o->iters = atoi(v);
        } else if (a == "--warmup") {
            o->warmup = atoi(v);
        } else if (a == "--rank") {
            o->rank = atoi(v);
        } else if (a == "--size") {
            o->size = atoi(v);
        } else if (a == "--timeout") {
            o->timeout_s = atoi(v);
        } else if (a == "--impl") {
            o->impl = v;
        } else if (a == "--csv") {
            o->csv = v;
        } else {
            fprintf(stderr, "gloo_bench: unknown option '%s'\n", a.c_str());
            return false;
        }
    }
    if (o->rank < 0) {
        o->rank = envInt("PMI_RANK", "RANK");
    }
    if (o->size < 0) {
        o->size = envInt("PMI_SIZE", "WORLD_SIZE");
    }
    if (o->rank < 0 || o->size < 1 || o->rank >= o->size) {
        fprintf(stderr, "gloo_bench: no rank/size (launch with mpiexec, or give --rank --size)\n");
        return false;
    }
    if (o->store.empty()) {
        fprintf(stderr, "gloo_bench: --store DIR is required (a fresh directory per run)\n");
        return false;
    }
    if (!o->allreduce && !o->allgather) {
        fprintf(stderr, "gloo_bench: --op must name allreduce and/or allgather\n");
        return false;
    }
    o->nsizes = peer_size_list(list, min, max, factor, o->sizes);
    return o->nsizes > 0 && o->iters > 0 && o->warmup >= 0;
}

class GlooBench {
  public:
    GlooBench(const GlooOpts &o, std::shared_ptr<gloo::Context> ctx) : o_(o), ctx_(std::move(ctx))
    {
        size_t max = 0;
        for (int s = 0; s < o_.nsizes; s++) {
            max = std::max(max, o_.sizes[s]);
        }
        // assign() touches every page now, not in a timed iteration
        send_.assign(max / sizeof(float) + 16, 0.0f);
        recv_.assign(max / sizeof(float) + 16, 0.0f);
        samples_.resize(size_t(o_.iters));
        if (ctx_->rank == 0 && !o_.csv.empty()) {
            csv_ = fopen(o_.csv.c_str(), "w");
            if (!csv_) {
                throw std::runtime_error("cannot write " + o_.csv);
            }
            peer_csv_header(csv_);
        }
    }
    ~GlooBench()
    {
        if (csv_) {
            fclose(csv_);
        }
    }

    void runAllreduce()
    {
        const int n = ctx_->size;
        header("allreduce");
        size_t last = 0;
        for (int s = 0; s < o_.nsizes; s++) {
            size_t count = o_.sizes[s] / sizeof(float);
            size_t bytes = count * sizeof(float);
            if (count == 0 || bytes == last) {
                continue;
            }
            last = bytes;
            fill(send_.data(), count, float(ctx_->rank + 1));
            gloo::AllreduceRing<float> algo(ctx_, {send_.data()}, int(count));
            double stats[3];
            measure([&] { algo.run(); }, stats);
            fill(send_.data(), count, float(ctx_->rank + 1));
            algo.run();
            double wrong = 0;
            const float e = float(n * (n + 1) / 2);
            for (size_t i = 0; i < count; i++) {
                wrong += send_[i] != e;
            }
            report("allreduce", "sum", bytes, count, "in", 2.0 * (n - 1) / n, stats, wrong);
        }
    }

    void runAllgather()
    {
        const int n = ctx_->size;
        header("allgather");
        size_t last = 0;
        for (int s = 0; s < o_.nsizes; s++) {
            size_t count = o_.sizes[s] / sizeof(float) / size_t(n);
            size_t bytes = count * sizeof(float) * size_t(n);
            if (count == 0 || bytes == last) {
                continue;
            }
            last = bytes;
            fill(send_.data(), count, float(ctx_->rank + 1));
            gloo::AllgatherRing<float> algo(ctx_, {send_.data()}, recv_.data(), int(count));
            double stats[3];
            measure([&] { algo.run(); }, stats);
            // a neighbour's data land in recv_ as soon as it sends: everyone
            // poisons first, then runs
            fill(recv_.data(), count * size_t(n), -1.0f);
            gloo::BarrierAllToAll(ctx_).run();
            algo.run();
            double wrong = 0;
            for (size_t i = 0; i < count * size_t(n); i++) {
                wrong += recv_[i] != float(i / count + 1);
            }
            report("allgather", "none", bytes, count, "out", double(n - 1) / n, stats, wrong);
        }
    }

  private:
    static void fill(float *p, size_t n, float v)
    {
        for (size_t i = 0; i < n; i++) {
            p[i] = v;
        }
    }

    template <typename F> void measure(F run, double stats[3])
    {
        for (int i = 0; i < o_.warmup; i++) {
            run();
        }
        gloo::BarrierAllToAll(ctx_).run();
        double start = peer_now();
        for (int i = 0; i < o_.iters; i++) {
            double t0 = peer_now();
            run();
            samples_[size_t(i)] = peer_now() - t0;
        }
        peer_stats(samples_.data(), o_.iters, peer_now() - start, stats);
    }

    void header(const char *op)
    {
        if (ctx_->rank == 0) {
            peer_columns(o_.impl.c_str(), op, ctx_->size);
        }
    }

    /* stats: max over ranks; wrong: sum over ranks. */
    void report(const char *op, const char *redop, size_t bytes, size_t count,
                const char *placement, double factor, double stats[3], double wrong)
    {
        gloo::AllreduceRing<double>(ctx_, {stats}, 3, gloo::ReductionFunction<double>::max).run();
        gloo::AllreduceRing<double>(ctx_, {&wrong}, 1).run();
        if (ctx_->rank == 0) {
            peer_report(csv_, o_.impl.c_str(), op, ctx_->size, redop, bytes, count, placement,
                        factor, (long long)wrong, stats);
        }
    }

    const GlooOpts &o_;
    std::shared_ptr<gloo::Context> ctx_;
    std::vector<float> send_; // (max elements,)
    std::vector<float> recv_; // (max elements,)
    std::vector<double> samples_; // (iters,)
    FILE *csv_ = nullptr;
};

} // namespace

int main(int argc, char **argv)
{
    GlooOpts o;
    if (!parse(argc, argv, &o)) {
        usage();
        return 2;
    }
    try {
        gloo::transport::tcp::attr attr;
        attr.hostname = o.host;
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        gloo::rendezvous::FileStore store(o.store);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
        ctx->setTimeout(std::chrono::seconds(o.timeout_s));
        ctx->connectFullMesh(store, dev);
        GlooBench bench(o, ctx);
        if (o.allreduce) {
            bench.runAllreduce();
        }
        if (o.allgather) {
            bench.runAllgather();
        }
    } catch (const std::exception &e) {
        fprintf(stderr, "gloo_bench: rank %d: %s\n", o.rank, e.what());
        return 1;
    }
    return 0;
}
