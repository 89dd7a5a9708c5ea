/*
 * leased: defaults -> options -> config -> daemon -> loop -> shutdown.
 *
 * main only: the options, the process set-up and the fork; from the loaded
 * configuration on, everything is ld_server.c's.
 */
#include "ld_common.h"

#include "ld_conf.h"
#include "ld_log.h"
#include "ld_server.h"
#include "ld_tls.h"

#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_CONF LD_SYSCONFDIR "/leased/leased.yml"

static void
usage(FILE *out)
{
    fprintf(out,
            "Usage: leased [-f] [-t] [-c FILE]\n"
            "\n"
            "Distributed locks and cache-aside over Redis, as a sidecar.\n"
            "\n"
            "  -c, --config FILE  configuration file, by default\n"
            "                     %s\n"
            "                     (built-in defaults when that file is "
            "missing)\n"
            "  -t, --test         test the configuration and exit (0 good, 1 "
            "bad)\n"
            "  -f, --foreground   stay in the foreground (implied under "
            "systemd)\n"
            "  -v, --version      print the version and exit\n"
            "  -h, --help         print this help and exit\n",
            DEFAULT_CONF);
}

/* Classic double fork. stderr stays open so `leased 2>>file` keeps the
 * log; stdin and stdout go to /dev/null. */
static int
daemonize(void)
{
    pid_t pid = fork();
    if (pid < 0) {
        return LD_ERR;
    }
    if (pid > 0) {
        _exit(0);
    }
    if (setsid() < 0) {
        return LD_ERR;
    }
    pid = fork();
    if (pid < 0) {
        return LD_ERR;
    }
    if (pid > 0) {
        _exit(0);
    }
    if (chdir("/") != 0) {
        return LD_ERR;
    }
    int fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
        dup2(fd, STDIN_FILENO);
        dup2(fd, STDOUT_FILENO);
        if (fd > STDERR_FILENO) {
            close(fd);
        }
    }
    return LD_OK;
}

/* -t: the configuration and the files it names; the line says what was
 * checked, the built-in defaults when the default file is missing. */
static int
test_config(const struct ld_options *opt, const struct ld_config *cfg)
{
    if (cfg->redis.tls.enabled) {
        char err[512];
        struct ssl_ctx_st *sctx = ld_tls_ctx_new(cfg, err, sizeof(err));
        if (sctx == NULL) {
            fprintf(stderr, "%s: %s\n", opt->conf_path, err);
            return 1;
        }
        ld_tls_ctx_free(sctx);
    }
    if (!opt->conf_explicit && access(opt->conf_path, F_OK) != 0) {
        printf("no configuration file %s: the built-in defaults are valid\n",
               opt->conf_path);
    } else {
        printf("configuration %s is valid\n", opt->conf_path);
    }
    return 0;
}

/* The command line into OPT and TEST_ONLY: -1 to go on, else the exit
 * status (of -v, -h or a usage error). */
static int
parse_options(int argc, char **argv, struct ld_options *opt, bool *test_only)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"test", no_argument, NULL, 't'},
        {"foreground", no_argument, NULL, 'f'},
        {"version", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int ch;

    while ((ch = getopt_long(argc, argv, "c:tfvh", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            opt->conf_path = optarg;
            opt->conf_explicit = true;
            break;
        case 't':
            *test_only = true;
            break;
        case 'f':
            opt->foreground = true;
            break;
        case 'v':
            printf("leased %s (protocol 1)\n", PACKAGE_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    return -1;
}

/* Reload reads the file again after the daemon has detached to "/": a
 * relative -c must keep naming the file it named at start. */
static void
absolute_conf_path(struct ld_options *opt)
{
    static char abs_conf[PATH_MAX];
    if (opt->conf_path[0] != '/' && getcwd(abs_conf, sizeof(abs_conf)) &&
        strlen(abs_conf) + 1 + strlen(opt->conf_path) < sizeof(abs_conf)) {
        strcat(abs_conf, "/");
        strcat(abs_conf, opt->conf_path);
        opt->conf_path = abs_conf;
    }
}

static void
process_setup(void)
{
    /* Before any socket exists: a client that hangs up mid-reply must
     * not kill the daemon. */
    signal(SIGPIPE, SIG_IGN);
    /* Large cache values pass through in lines and buffers of their size,
     * allocated and freed at once: glibc gave the top of the heap back to
     * the kernel after each burst and took it again at the next (a brk, a
     * TLB flush and page faults per burst, several percent of the time of
     * 10 KB hits). The daemon keeps up to 16 MB of freed heap;
     * allocations of 1 MB and more are mapped on their own and
     * returned when freed. */
    mallopt(M_TRIM_THRESHOLD, 16 * 1024 * 1024);
    mallopt(M_MMAP_THRESHOLD, 1024 * 1024);
}

int
main(int argc, char **argv)
{
    struct ld_options opt = {DEFAULT_CONF, false, false};
    bool test_only = false;

    int rc = parse_options(argc, argv, &opt, &test_only);
    if (rc >= 0) {
        return rc;
    }
    absolute_conf_path(&opt);
    process_setup();

    struct ld_config cfg;
    if (ld_server_load_config(&opt, &cfg) != LD_OK) {
        ld_conf_free(&cfg);
        return 1;
    }
    if (test_only) {
        rc = test_config(&opt, &cfg);
        ld_conf_free(&cfg);
        return rc;
    }

    ld_log_open("leased", cfg.log.target == LD_LOG_TARGET_SYSLOG);
    ld_log_set_level(cfg.log.level);

    if (!opt.foreground && getenv("NOTIFY_SOCKET") == NULL &&
        daemonize() != LD_OK) {
        log_error("daemonize failed");
        return 1;
    }

    int status = ld_server_run(&opt, &cfg);
    ld_conf_free(&cfg);
    ld_log_close();
    return status;
}
