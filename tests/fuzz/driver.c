/*
 * Runs a fuzz target's LLVMFuzzerTestOneInput over every file of its seed
 * corpus, for builds without libFuzzer: the corpus becomes a regression
 * suite that `make check` runs, under the sanitizers when they are on.
 *
 * With no arguments the corpus is $LD_SRCDIR/tests/fuzz/corpus/<name>,
 * <name> being this program's name; arguments name files or directories
 * instead. Output is TAP, one test per input file, so that a crash shows
 * as the plan falling short and a hang as the test's timeout.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct list {
    char **items;
    size_t count, cap;
};

static void
add(struct list *l, const char *path)
{
    if (l->count == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->items = realloc(l->items, l->cap * sizeof(*l->items));
        if (l->items == NULL) {
            perror("realloc");
            exit(99);
        }
    }
    l->items[l->count] = strdup(path);
    if (l->items[l->count] == NULL) {
        perror("strdup");
        exit(99);
    }
    l->count++;
}

static int
cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Files of PATH (a file, or a directory of files), sorted so that the
 * test numbers stay put from run to run. */
static int
collect(struct list *l, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        add(l, path);
        return 0;
    }
    DIR *d = opendir(path);
    if (d == NULL) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t first = l->count;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') {
            continue;
        }
        char buf[4096];
        snprintf(buf, sizeof(buf), "%s/%s", path, e->d_name);
        if (stat(buf, &st) == 0 && S_ISREG(st.st_mode)) {
            add(l, buf);
        }
    }
    closedir(d);
    qsort(l->items + first, l->count - first, sizeof(*l->items), cmp);
    return 0;
}

/* The input's name in test lines: its path below the corpus root, so the
 * log reads the same in every build tree. */
static const char *
shown(const char *path)
{
    const char *p = strstr(path, "/corpus/");
    return p != NULL ? p + strlen("/corpus/") : path;
}

static int
read_file(const char *path, uint8_t **data, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return -1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    while (buf != NULL) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) {
            break;
        }
        cap *= 2;
        uint8_t *more = realloc(buf, cap);
        if (more == NULL) {
            free(buf);
        }
        buf = more;
    }
    int bad = ferror(f);
    fclose(f);
    if (buf == NULL || bad) {
        free(buf);
        return -1;
    }
    /* An exact-size copy, so that the sanitizers see a read past the
     * input's end as the fuzzer would. */
    uint8_t *exact = malloc(len > 0 ? len : 1);
    if (exact == NULL) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, len);
    free(buf);
    *data = exact;
    *size = len;
    return 0;
}

int
main(int argc, char **argv)
{
    struct list files = {NULL, 0, 0};
    int status = 0;

    if (argc > 1) {
        for (int i = 1; i < argc; i++) {
            if (collect(&files, argv[i]) != 0) {
                status = 1;
            }
        }
    } else {
        const char *name = strrchr(argv[0], '/');
        name = name != NULL ? name + 1 : argv[0];
        const char *src = getenv("LD_SRCDIR");
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s/tests/fuzz/corpus/%s",
                 src != NULL ? src : ".", name);
        if (collect(&files, dir) != 0) {
            status = 1;
        }
    }

    if (files.count == 0 && status == 0) {
        /* An empty corpus is a broken test, not a passing one. */
        printf("1..1\nnot ok 1 - empty corpus\n");
        return 1;
    }
    int listed = status;
    printf("1..%zu\n", files.count + (listed != 0 ? 1 : 0));
    for (size_t i = 0; i < files.count; i++) {
        uint8_t *data = NULL;
        size_t size = 0;
        /* Printed before the run so that a crash names its input. */
        fprintf(stderr, "# %s\n", files.items[i]);
        fflush(stdout);
        if (read_file(files.items[i], &data, &size) != 0) {
            printf("not ok %zu - %s: cannot read\n", i + 1,
                   shown(files.items[i]));
            status = 1;
        } else {
            LLVMFuzzerTestOneInput(data, size);
            free(data);
            printf("ok %zu - %s\n", i + 1, shown(files.items[i]));
        }
        fflush(stdout);
        free(files.items[i]);
    }
    free(files.items);
    if (listed != 0) {
        printf("not ok %zu - corpus could not be listed\n", files.count + 1);
    }
    return status;
}
