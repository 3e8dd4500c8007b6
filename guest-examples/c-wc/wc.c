/*
 * Flint example task in C (clang + wasi-libc): counts the lines, words and bytes of its
 * input, like wc(1), and writes them as JSON: {"lines":L,"words":W,"bytes":B}.
 *
 * With no argument it reads stdin (the task's input); with arguments it reads each named
 * job file from /files/<name> instead and sums them. A file the job does not have is a
 * usage error: exit code 64, with the reason in the task's log (stderr).
 *
 * Build: clang --target=wasm32-wasi -O2 -o wc.wasm wc.c   (see build.sh)
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct counts {
    unsigned long long lines, words, bytes;
};

static void count(FILE *in, struct counts *c) {
    int in_word = 0;
    int ch;
    while ((ch = getc(in)) != EOF) {
        c->bytes++;
        if (ch == '\n') c->lines++;
        if (isspace(ch)) {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            c->words++;
        }
    }
}

int main(int argc, char **argv) {
    struct counts c = {0, 0, 0};
    if (argc <= 1) {
        count(stdin, &c);
    }
    /* argv[0] is the job's name; the rest are job files. */
    for (int i = 1; i < argc; i++) {
        if (strchr(argv[i], '/') != NULL) {
            fprintf(stderr, "wc: `%s` is not a job file name\n", argv[i]);
            return 64;
        }
        char path[256];
        snprintf(path, sizeof path, "/files/%s", argv[i]);
        FILE *f = fopen(path, "rb");
        if (f == NULL) {
            fprintf(stderr, "wc: the job has no file `%s`\n", argv[i]);
            return 64;
        }
        count(f, &c);
        fclose(f);
    }
    const char *task = getenv("FLINT_TASK_INDEX");
    fprintf(stderr, "wc: task %s counted %llu bytes\n", task ? task : "?", c.bytes);
    printf("{\"lines\":%llu,\"words\":%llu,\"bytes\":%llu}", c.lines, c.words, c.bytes);
    return 0;
}
