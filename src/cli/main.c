/* tensorpar — the command-line front end.  Each command lives in its own
 * cmd_*.c file and is a thin user of libtensorpar. */
#include "cli.h"

#include <string.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"make-model", cmd_make_model, "write a random-weight Hugging Face model directory"},
    {"logits", cmd_logits, "run a forward pass and write the logits as .npy"},
    {"grads", cmd_grads, "one forward and backward of the causal-LM loss; gradients as .safetensors"},
    {"train", cmd_train, "fine-tune a model on a data file (--tp N: split over N ranks)"},
    {"merge", cmd_merge, "fold a PEFT LoRA adapter into a model and save it (--tp N: split over N ranks)"},
    {"generate", cmd_generate, "generate tokens from a prompt"},
    {"chat", cmd_chat, "interactive chat with a model"},
    {"tokenize", cmd_tokenize, "encode text into token ids with a tokenizer.json"},
    {"detokenize", cmd_detokenize, "decode token ids into text"},
    {"chat-template", cmd_chat_template, "render a tokenizer's chat template for a conversation"},
    {"plan", cmd_plan, "show how a model is split for tensor parallelism (reads config.json only)"},
    {"launch", cmd_launch, "run a program as N ranks (like torchrun)"},
    {"bench", cmd_bench, "measure speed: bench comm"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tensorpar <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (commands[i].summary) fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n  --isa-list     the instruction-set paths this CPU supports, the chosen one marked\n");
    fprintf(f, "  --help-env     the TENSORPAR_* environment variables: type, default, meaning\n");
    fprintf(f, "\n'tensorpar <command> --help' describes a command.\n\n%s", CLI_EXIT_HELP);
    fprintf(f, "TENSORPAR_ISA=scalar|avx2|avx512|amx chooses the kernels' path (default: the best this CPU has).\n");
    fprintf(f, "\nWith RANK and WORLD_SIZE set (torchrun-style; WORLD_SIZE > 1 needs RANK) or under\n"
               "mpirun, a model command runs as one rank of that job; --tp N starts N ranks itself.\n"
               "Errors every rank meets are printed once; others start with \"[rank r]\".\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) { usage(stderr); return CLI_EXIT_USAGE; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--isa-list")) return cmd_isa_list();
    if (!strcmp(argv[1], "--help-env")) return cmd_help_env();
    /* Before any command runs, so each refuses a bad TENSORPAR_ISA or any
     * other bad setting alike. */
    int rc = cli_isa_check();
    if (!rc) rc = cli_settings_check();
    if (rc) return rc;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "tensorpar: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
