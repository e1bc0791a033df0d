/* The public umbrella header: a C program that includes only <tensorpar.h>
 * (and none of the library's private src/ headers: tests/CMakeLists.txt
 * builds this test without them) reaches one function of every subsystem. */
#include <tensorpar.h>

#include <stdio.h>
#include <string.h>

static int failed;

#define EXPECT(cond) do { \
    if (!(cond)) { failed++; fprintf(stderr, "%s:%d: failed: %s (%s)\n", __FILE__, __LINE__, #cond, tp_error()); } \
} while (0)

int main(void)
{
    /* base */
    tp_dtype dt;
    EXPECT(tp_dtype_parse("bf16", &dt) == TP_OK && dt == TP_BF16 && tp_dtype_size(dt) == 2);
    /* kernels */
    tp_isa isa;
    EXPECT(tp_isa_parse("scalar", &isa) == TP_OK && !strcmp(tp_isa_name(isa), "scalar"));
    /* io */
    tp_arch arch;
    EXPECT(tp_arch_parse("qwen2", &arch) == TP_OK && arch == TP_ARCH_QWEN2);
    /* comm */
    tp_backend be;
    EXPECT(tp_backend_parse("shm", &be) == TP_OK && !strcmp(tp_backend_name(be), "shm"));
    /* dist: 10 rows over 3 ranks, torch.chunk style: 4, 4, 2 */
    int64_t start, size;
    tp_chunk_range(10, 3, 2, &start, &size);
    EXPECT(start == 8 && size == 2);
    /* models */
    tp_model_config cfg;
    EXPECT(tp_preset_config(&cfg, TP_ARCH_LLAMA, "tiny") == TP_OK && cfg.hidden_size == 64);
    tp_module *mods = NULL;
    size_t n_mods = 0;
    EXPECT(tp_module_table_build(&cfg, &mods, &n_mods) == TP_OK && n_mods == 28 && mods[1].type == TP_MT_EMBEDDING);
    tp_module_table_free(mods, n_mods);
    /* parallel */
    const tp_style *st = tp_style_registry_get(NULL, "colwise");
    EXPECT(st && !strcmp(st->impl, "ColwiseParallel"));
    /* text */
    tp_sampling sp;
    tp_sampling_defaults(&sp);
    EXPECT(tp_sampling_validate(&sp) == TP_OK);
    sp.top_p = 2.0;
    EXPECT(tp_sampling_validate(&sp) != TP_OK);
    /* train: HF's linear schedule halfway through its decay */
    tp_lr_schedule lrs = {TP_LR_LINEAR, 1.0, 0, 10, 0};
    EXPECT(tp_lr_schedule_check(&lrs) == TP_OK && tp_lr_at(&lrs, 5) == 0.5);
    /* api: DistributedConfig(tp_plan="auto") on 4 processes: tp_size 4 */
    tp_dist_config dc = {.tp_plan = "auto"};
    tp_dist_sizes ds;
    EXPECT(tp_dist_config_resolve(&dc, 4, 1, &ds) == TP_OK && ds.tp_size == 4);

    printf("%s\n", failed ? "FAILED" : "ok");
    return failed ? 1 : 0;
}
