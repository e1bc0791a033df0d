/* tensorpar bench tokenize: tokenizer load time and encoding throughput on a
 * text file (bench/tokenizer/run.sh compares it with Hugging Face's Rust
 * tokenizers, through the npm package, on the same text). */
#include "cli.h"
#include "tensorpar/io.h"
#include "tensorpar/text.h"

#include <stdlib.h>
#include <string.h>

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int cmd_bench_tokenize(int argc, char **argv)
{
    cli_option o[] = {
        {"--tokenizer", "FILE|DIR", "tokenizer.json or its folder (required)", 0, {0}},
        {"--text-file", "FILE", "UTF-8 text to encode (required)", 0, {0}},
        {"--repeat", "N", "encodings of the whole text (default 5)", 0, {0}},
        {"--json", NULL, "print one JSON object", 0, {0}},
    };
    int n = (int)(sizeof o / sizeof o[0]);
    int rc = cli_parse(argc, argv, o, n, "tensorpar bench tokenize --tokenizer DIR --text-file FILE [--json]",
                       "Measures tokenizer loading and encoding throughput (one thread).", NULL, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    const char *tok_path = cli_value(o, n, "--tokenizer"), *text_path = cli_value(o, n, "--text-file");
    long long repeat = 5;
    if (!tok_path || !text_path) { fprintf(stderr, "tensorpar bench tokenize: error: --tokenizer and --text-file are required\n"); return 2; }
    if (cli_int(o, n, "--repeat", &repeat) || repeat < 1) return cli_report("bench tokenize");
    char *text;
    size_t len;
    if (tp_read_file(text_path, &text, &len)) return cli_report("bench tokenize");
    double loads[5], t0;
    tp_tokenizer *tok = NULL;
    for (int i = 0; i < 5; i++) {
        if (tok) tp_tokenizer_free(tok);
        t0 = tp_now();
        if (tp_tokenizer_load(&tok, tok_path)) { free(text); return cli_report("bench tokenize"); }
        loads[i] = tp_now() - t0;
    }
    double *secs = malloc((size_t)repeat * sizeof *secs);
    size_t n_ids = 0;
    for (long long i = 0; secs && i < repeat; i++) {
        int32_t *ids;
        t0 = tp_now();
        if (tp_tokenizer_encode(tok, text, len, 0, &ids, &n_ids)) { free(secs); secs = NULL; break; }
        secs[i] = tp_now() - t0;
        free(ids);
    }
    tp_tokenizer_free(tok);
    free(text);
    if (!secs) return cli_report("bench tokenize");
    double enc = median(secs, (int)repeat), load = median(loads, 5);
    free(secs);
    if (cli_flag(o, n, "--json"))
        printf("{\"bench\": \"tokenize\", \"engine\": \"tensorpar\", \"bytes\": %zu, \"tokens\": %zu, "
               "\"load_ms\": %.2f, \"encode_s\": %.4f, \"mb_per_s\": %.2f}\n",
               len, n_ids, load * 1e3, enc, (double)len / enc / 1e6);
    else
        printf("tensorpar: load %.1f ms; %zu bytes -> %zu tokens in %.3f s = %.2f MB/s\n",
               load * 1e3, len, n_ids, enc, (double)len / enc / 1e6);
    return 0;
}
