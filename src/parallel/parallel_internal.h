/* Shared between the files of parallel/: the built-in style templates and
 * small helpers.  Not part of the public API. */
#ifndef TP_PARALLEL_INTERNAL_H
#define TP_PARALLEL_INTERNAL_H

#include "tensorpar/parallel.h"

/* Built-in style templates, one family per file (style_*.c).  The registry
 * lists them in §2.1 order. */
extern const tp_style tp_par_embedding_rowwise, tp_par_embedding_colwise;
extern const tp_style tp_par_colwise_gather_output, tp_par_colwise_rep, tp_par_colwise;
extern const tp_style tp_par_rowwise, tp_par_rowwise_split_input, tp_par_rowwise_rep;
extern const tp_style tp_par_packed_colwise, tp_par_packed_rowwise, tp_par_sequence_parallel;
extern const tp_style tp_par_replicated_with_grad_allreduce, tp_par_mla_kv_a_proj, tp_par_all_reduce;
extern const tp_style tp_par_moe_tp_experts, tp_par_moe_identity_expert, tp_par_local_params;
extern const tp_style tp_par_grouped_gemm, tp_par_ep_router;
extern const tp_style tp_par_local_colwise, tp_par_local_rowwise, tp_par_local_packed_rowwise;
extern const tp_style tp_par_gather, tp_par_local, tp_par_replicate;

/* Shard(d) with d made non-negative for an ndim-dim tensor (d may be < 0). */
tp_placement tp_par_shard(int d, int ndim);
tp_placement tp_par_strided(int d, int ndim, int split);

/* The qualified name without its last component ("lm_head.weight" -> "lm_head"). */
void tp_par_parent_name(const char *name, char *out, size_t cap);

/* Python's repr of a string ('abc', or "it's") appended to a growing buffer. */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} tp_par_buf;
void tp_par_buf_puts(tp_par_buf *b, const char *s);
void tp_par_buf_printf(tp_par_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tp_par_buf_pyrepr(tp_par_buf *b, const char *s);
/* Hands the string over (NULL after an allocation failure). */
char *tp_par_buf_take(tp_par_buf *b);

/* A forward description with every layout Replicate (nothing moves). */
tp_forward_desc tp_par_desc_passthrough(void);
/* One that leaves both layouts to the module: input "converted to local",
 * output "returned local" (filled in by tp_plan_check_flow). */
tp_forward_desc tp_par_desc_local(void);
/* install_forward of the styles whose forward is tp_par_desc_local's: the
 * module runs as it is and something else (or nothing) communicates. */
tp_status tp_par_forward_local(const tp_style *st, const tp_module_ctx *mod, tp_forward_desc *d);

#endif
