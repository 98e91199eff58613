/*
 * spec.h - models described as data: the parameter table every layer reads
 * (names, shapes, units, offsets, init, weight decay, tensor-parallel
 * placement, tied parameters), the architecture attribute table that io
 * walks to read, write, compare and print a model's config, sets of
 * architectures, and the table of registered architectures.
 *
 * Nothing here computes a model. An architecture (src/model) builds its
 * spec from its config and registers a struct fsdp_arch; the callers of io
 * hand it a set of them, so that io can open a file of any architecture it
 * is given without knowing any of them, and the engine can shard any model
 * by its table alone.
 *
 * Units are what the sharding engine gathers and reduces as one buffer:
 * a unit's parameters sit one after the other in one contiguous buffer, at
 * the offsets the table gives. Weights are (out_features, in_features) like
 * torch.nn.Linear; a 1-D tensor has shape (n, 1).
 */
#ifndef FSDP_CORE_SPEC_H
#define FSDP_CORE_SPEC_H

#include <stddef.h>

#define FSDP_PARAM_NAME_MAX 64
#define FSDP_ARCH_NAME_MAX 32
#define FSDP_MAX_TIES 4

enum fsdp_init_kind {
    FSDP_INIT_NORMAL = 0, /* N(0, std) */
    FSDP_INIT_ZEROS,
    FSDP_INIT_ONES,
};

/* How tensor parallelism splits a parameter (read by the parallelisms). */
enum fsdp_tp_place {
    FSDP_TP_REPLICATE = 0, /* every tp rank holds all of it (norms, biases of row-split layers) */
    FSDP_TP_COLWISE,       /* dim 0 split: the output features of a Linear (and its bias) */
    FSDP_TP_ROWWISE,       /* dim 1 split: the input features of a Linear */
    FSDP_TP_VOCAB,         /* dim 0 split of an embedding or LM head over the vocabulary */
};

struct fsdp_param_spec {
    char name[FSDP_PARAM_NAME_MAX]; /* "h.3.attn.c_attn.weight" */
    int unit;                       /* owning unit */
    int ndim;                       /* 1 or 2 */
    size_t shape[2];                /* (rows, cols); cols = 1 when ndim == 1 */
    size_t numel;
    size_t offset;                  /* element offset inside the unit buffer */
    int decay;                      /* weight decay applies */
    enum fsdp_init_kind init;
    float std;                      /* for FSDP_INIT_NORMAL */
    enum fsdp_tp_place tp;
};

/*
 * A parameter used by a unit other than its own: unit `user` reads
 * parameter `param` (owned by unit `owner`) in its forward and adds into its
 * gradient in its backward (GPT-2's LM head tied to wte). A driver keeps the
 * owner's parameters available while the user computes, and reduces the
 * owner's gradient only after both have run their backward.
 */
struct fsdp_tie {
    int user;
    int owner;
    size_t param;
};

struct fsdp_arch;
struct fsdp_hf_map;

struct fsdp_model_spec {
    const struct fsdp_arch *arch;    /* the architecture that built it */
    void *cfg;                       /* (arch->cfg_size bytes) its config, owned */
    int vocab_size;                  /* token ids are in [0, vocab_size) */
    int context;                     /* longest sequence */
    int n_units;
    size_t n_params;                 /* entries in params */
    size_t params_cap;               /* entries allocated */
    struct fsdp_param_spec *params;  /* (n_params,) in unit order */
    size_t *unit_numel;              /* (n_units,) elements per unit */
    size_t *unit_first;              /* (n_units,) index of the unit's first param */
    size_t total_numel;
    int n_ties;
    struct fsdp_tie ties[FSDP_MAX_TIES];
    /* The tokenizer's begin- and end-of-text ids, -1 when unknown: not part
     * of the architecture (never compared), carried from file to file so
     * that an exported model stops generating where its tokenizer ends. */
    long bos_token_id;
    long eos_token_id;
};

/* An empty table for n_units units and up to max_params parameters, with a
 * zeroed config of arch->cfg_size bytes (filled by the caller). */
int fsdp_model_spec_alloc(const struct fsdp_arch *arch, int n_units, size_t max_params,
                          struct fsdp_model_spec **out);
/* Appends a parameter to unit `unit` (units are filled in order). */
int fsdp_model_spec_add(struct fsdp_model_spec *s, int unit, const char *name, size_t rows,
                        size_t cols, int ndim, enum fsdp_init_kind init, float std, int decay,
                        enum fsdp_tp_place tp);
/* Records that unit `user` uses parameter `name` of another unit. */
int fsdp_model_spec_tie(struct fsdp_model_spec *s, int user, const char *name);
/* A language model's head in unit `unit`: tied to the embedding `embedding`,
 * or a weight of its own, lm_head.weight (vocab, n_embd), N(0, std), decayed,
 * split over the vocabulary. */
int fsdp_model_spec_add_head(struct fsdp_model_spec *s, int unit, int tied, const char *embedding,
                             size_t vocab, size_t n_embd, float std);
/* A spec builder's last step: *out = s when rc, the OR of its adds and ties,
 * is 0; otherwise s is destroyed and the error is internal. */
int fsdp_model_spec_finish(struct fsdp_model_spec *s, int rc, struct fsdp_model_spec **out);
void fsdp_model_spec_destroy(struct fsdp_model_spec *s);
/* Elements of the largest parameter (at least 1): one tensor's buffer. */
size_t fsdp_model_spec_largest(const struct fsdp_model_spec *s);
/* Index of the parameter called name, or -1. */
long fsdp_model_spec_find(const struct fsdp_model_spec *s, const char *name);
/* Elements [start, start + count) must lie inside unit u; the error says how not. */
int fsdp_model_spec_range_check(const struct fsdp_model_spec *s, int u, size_t start,
                                size_t count);
/* The overlap [*lo, *hi) of elements [start, start + count) of p's unit buffer
 * with parameter p, in unit coordinates; 0 when they do not overlap. */
static inline int fsdp_param_piece(const struct fsdp_param_spec *p, size_t start, size_t count,
                                   size_t *lo, size_t *hi)
{
    *lo = start > p->offset ? start : p->offset;
    *hi = start + count < p->offset + p->numel ? start + count : p->offset + p->numel;
    return *lo < *hi;
}
/* The tie whose user is unit u and whose owner is another unit, or NULL. */
const struct fsdp_tie *fsdp_model_spec_tie_of(const struct fsdp_model_spec *s, int user);

// ----------------------------------------------------------------------------
// architecture attributes: one table per architecture, walked by every
// reader, writer, comparison and printer of a config

enum fsdp_attr_type {
    FSDP_ATTR_INT = 0, /* int field; stored as a 64-bit integer attribute */
    FSDP_ATTR_FLOAT,   /* float field; stored as a 32-bit float attribute */
    FSDP_ATTR_BOOL,    /* int field holding 0 or 1; stored as an integer attribute */
};

struct fsdp_attr_desc {
    const char *name;         /* attribute name in files: "vocab_size" */
    enum fsdp_attr_type type;
    size_t offset;            /* offsetof() in the architecture's config struct */
};

/* Value of attribute a of cfg as a double (int fields are exact). */
double fsdp_attr_get(const struct fsdp_attr_desc *a, const void *cfg);
/* Stores v into cfg; an int field out of range, a BOOL not 0/1 or a FLOAT
 * that is not finite is an error naming the attribute. */
int fsdp_attr_set(const struct fsdp_attr_desc *a, void *cfg, double v);
/* "vocab_size 50257, context 1024, ..." */
void fsdp_attrs_format(const struct fsdp_arch *arch, const void *cfg, char *buf, size_t len);
/* -1 when a and b agree on every attribute, else the index of the first
 * that differs. */
int fsdp_attrs_diff(const struct fsdp_arch *arch, const void *a, const void *b);

// ----------------------------------------------------------------------------
// registered architectures

/*
 * What io and the tools need of an architecture, filled by src/model (the
 * model ops, which compute, are src/model/model.h's). Members are only ever
 * added at the end.
 */
struct fsdp_arch {
    size_t size;                       /* sizeof(struct fsdp_arch) of the registrant */
    const char *name;                  /* the files' "architecture" attribute: "gpt2" */
    size_t cfg_size;                   /* bytes of its config struct */
    const struct fsdp_attr_desc *attrs;
    size_t n_attrs;
    /* Checks ranges and divisibility; the error names the field. */
    int (*validate)(const void *cfg);
    /* The parameter table of cfg (validated first). */
    int (*spec_create)(const void *cfg, struct fsdp_model_spec **out);
    /* Named presets ("tiny", "gpt2", ...) into cfg; NULL: none. */
    int (*preset)(const char *name, void *cfg);
    /* The model ops (src/model/model.h), opaque here. */
    const void *ops;
    /* Which config fields parameter `name`'s shape follows, for messages
     * ("vocab_size=256, n_embd=128"); NULL: the whole config is shown. */
    void (*shape_reason)(const void *cfg, const char *name, char *buf, size_t len);
    /* A short config line for run headers ("L=12 NH=12 C=768 V=50257
     * context=1024 tied"); NULL: fsdp_attrs_format. */
    void (*describe)(const void *cfg, char *buf, size_t len);
    /* How Hugging Face transformers names, lays out and configures it
     * (core/hf_map.h); NULL: it has no counterpart there. Read it through
     * fsdp_arch_hf(), which checks size. */
    const struct fsdp_hf_map *hf;
};

/* arch->describe, or the attribute list. */
void fsdp_arch_describe(const struct fsdp_arch *arch, const void *cfg, char *buf, size_t len);

/*
 * A set of architectures, handed down by whoever knows them: io reads and
 * checks files of the architectures its caller passes it and of no other,
 * so it depends on no table an upper layer must have filled first.
 */
struct fsdp_arch_set {
    const struct fsdp_arch *const *arch; /* (n,) */
    size_t n;
};

/* The architecture of set called name, or NULL (no error recorded). */
const struct fsdp_arch *fsdp_arch_set_find(const struct fsdp_arch_set *set, const char *name);
/* "gpt2, mlp": set's names, for messages. */
void fsdp_arch_set_names(const struct fsdp_arch_set *set, char *buf, size_t len);

/* Adds arch to the table (its name must be new). At most 16. */
int fsdp_arch_register(const struct fsdp_arch *arch);
/* The architecture called name, or NULL (no error recorded). */
const struct fsdp_arch *fsdp_arch_find(const char *name);
/* "gpt2, mlp" for messages. */
void fsdp_arch_names(char *buf, size_t len);
/* The registered architectures as a set for io (the table itself: one
 * registered later is in it too; register before the first file is read). */
const struct fsdp_arch_set *fsdp_arch_registered(void);
/* The i-th registered architecture (registration order), NULL past the last. */
const struct fsdp_arch *fsdp_arch_at(int i);
/* The registered architecture with a preset called name, and that preset's
 * config in *cfg (allocated; free() it). An unknown name is an error
 * listing every architecture's presets. */
int fsdp_arch_preset(const char *name, const struct fsdp_arch **arch, void **cfg);

#endif
