/* Framing and request parsing, from raw bytes. */
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_frame.h"
#include "ld_json.h"
#include "ld_proto.h"

#include "unit.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

static struct ld_config cfg;
static struct ld_ctx ctx;

static void
setup(void)
{
    ld_conf_defaults(&cfg);
    ctx.cfg = &cfg;
    ld_proto_init(&ctx, NULL);
}

static void
teardown(void)
{
    ld_conf_free(&cfg);
    ld_proto_free();
    ctx.cfg = NULL;
}

/* Append one framing result to OUT as "L:<line>" / "T", joined by '|'. */
static void
note(enum ld_frame_result r, const char *line, size_t ll, char *out,
     size_t outlen)
{
    if (r == LD_FRAME_TOO_LARGE) {
        strncat(out, "T|", outlen - strlen(out) - 1);
    } else {
        ck_assert_uint_eq(strlen(line), ll);
        strncat(out, "L:", outlen - strlen(out) - 1);
        strncat(out, line, outlen - strlen(out) - 1);
        strncat(out, "|", outlen - strlen(out) - 1);
    }
}

/* Feed BYTES in chunks of CHUNK through ld_frame_next and collect what
 * the framer yields into OUT. */
static void
feed_buffered(struct ld_framer *f, const char *bytes, size_t len, size_t chunk,
              char *out, size_t outlen)
{
    struct evbuffer *in = evbuffer_new();
    out[0] = '\0';
    for (size_t off = 0; off < len; off += chunk) {
        size_t n = len - off < chunk ? len - off : chunk;
        evbuffer_add(in, bytes + off, n);
        for (;;) {
            char *line = NULL;
            size_t ll = 0;
            enum ld_frame_result r = ld_frame_next(f, in, &line, &ll);
            if (r == LD_FRAME_NEED_MORE) {
                break;
            }
            note(r, line, ll, out, outlen);
            free(line);
        }
    }
    evbuffer_free(in);
}

/* The same through ld_frame_take, as a session reads: each chunk is a
 * fresh read, framed in place. With STOP, framing stops after every
 * line and the rest of the read is kept (ld_frame_keep), as a session
 * does at the end of its turn. */
static void
feed_fresh(struct ld_framer *f, const char *bytes, size_t len, size_t chunk,
           bool stop, char *out, size_t outlen)
{
    struct evbuffer *in = evbuffer_new();
    char *buf = malloc(chunk + 1);
    out[0] = '\0';
    for (size_t off = 0; off < len; off += chunk) {
        size_t n = len - off < chunk ? len - off : chunk;
        size_t pos = 0;
        memcpy(buf, bytes + off, n);
        for (;;) {
            char *line = NULL;
            size_t ll = 0;
            bool owned = false;
            enum ld_frame_result r = ld_frame_take(f, in, buf, n, &pos, &line,
                                                   &ll, &owned);
            if (r == LD_FRAME_NEED_MORE) {
                ck_assert_uint_eq(pos, n);
                break;
            }
            note(r, line, ll, out, outlen);
            if (r == LD_FRAME_LINE) {
                ck_assert(owned == (line < buf || line >= buf + n));
            }
            if (owned) {
                free(line);
            }
            if (stop) {
                ld_frame_keep(f, in, buf, n, &pos);
            }
        }
    }
    free(buf);
    evbuffer_free(in);
}

/* Every way of framing the same bytes yields the same lines. */
static void
feed(struct ld_framer *f, const char *bytes, size_t len, size_t chunk,
     char *out, size_t outlen)
{
    struct ld_framer f2 = *f;
    struct ld_framer f3 = *f;
    char *alt = malloc(outlen);
    feed_buffered(f, bytes, len, chunk, out, outlen);
    feed_fresh(&f2, bytes, len, chunk, false, alt, outlen);
    ck_assert_msg(strcmp(out, alt) == 0, "in place, chunk %zu: %s / %s", chunk,
                  out, alt);
    feed_fresh(&f3, bytes, len, chunk, true, alt, outlen);
    ck_assert_msg(strcmp(out, alt) == 0, "kept, chunk %zu: %s / %s", chunk,
                  out, alt);
    free(alt);
}

START_TEST(split_reads)
{
    const char *bytes = "{\"op\":\"ping\"}\n{\"op\":\"stats\"}\n";
    char out[256];
    /* Every chunk size from one byte up gives the same two lines. */
    for (size_t chunk = 1; chunk <= strlen(bytes); chunk++) {
        struct ld_framer f = {.max_bytes = 1024};
        feed(&f, bytes, strlen(bytes), chunk, out, sizeof(out));
        ck_assert_str_eq(out, "L:{\"op\":\"ping\"}|L:{\"op\":\"stats\"}|");
    }
}
END_TEST

START_TEST(several_per_read_and_crlf)
{
    const char *bytes = "a\r\nb\n\nc\r\n";
    char out[256];
    struct ld_framer f = {.max_bytes = 1024};
    feed(&f, bytes, strlen(bytes), strlen(bytes), out, sizeof(out));
    ck_assert_str_eq(out, "L:a|L:b|L:|L:c|");
}
END_TEST

START_TEST(partial_line_waits)
{
    char out[256];
    struct ld_framer f = {.max_bytes = 1024};
    feed(&f, "{\"op\":", 6, 6, out, sizeof(out));
    ck_assert_str_eq(out, "");
}
END_TEST

START_TEST(oversize_line_skipped)
{
    /* 20-byte limit: the long line is reported once, skipped up to its
     * newline, and the next line comes through whole. */
    char bytes[256];
    memset(bytes, 'x', 100);
    memcpy(bytes + 100, "\nok\n", 5);
    for (size_t chunk = 1; chunk <= 104; chunk += 7) {
        char out[256];
        struct ld_framer f = {.max_bytes = 20};
        feed(&f, bytes, 104, chunk, out, sizeof(out));
        ck_assert_str_eq(out, "T|L:ok|");
    }
}
END_TEST

/* An over-long line is dropped, but its first bytes are kept: the HTTP
 * guard must see a request line whose URL is megabytes long. */
START_TEST(oversize_line_head_kept)
{
    char bytes[256];
    memcpy(bytes, "POST /", 6);
    memset(bytes + 6, 'a', 94);
    memcpy(bytes + 100, " HTTP/1.1\n", 11);
    for (size_t chunk = 1; chunk <= 111; chunk += 5) {
        char out[256];
        struct ld_framer f = {.max_bytes = 20};
        struct ld_framer f2 = {.max_bytes = 20};
        feed_buffered(&f, bytes, 110, chunk, out, sizeof(out));
        ck_assert_str_eq(out, "T|");
        feed_fresh(&f2, bytes, 110, chunk, false, out, sizeof(out));
        ck_assert_str_eq(out, "T|");
        ck_assert_uint_eq(f.head_len, LD_FRAME_HEAD_BYTES);
        ck_assert_uint_eq(f2.head_len, LD_FRAME_HEAD_BYTES);
        ck_assert(memcmp(f.head, "POST /aaaaaaaaaa", 16) == 0);
        ck_assert(memcmp(f2.head, "POST /aaaaaaaaaa", 16) == 0);
    }
}
END_TEST

START_TEST(line_at_limit_accepted)
{
    char out[256];
    struct ld_framer f = {.max_bytes = 5};
    feed(&f, "12345\n123456\nz\n", 15, 15, out, sizeof(out));
    ck_assert_str_eq(out, "L:12345|T|L:z|");
}
END_TEST

/* The terminator does not count: a line of exactly the limit is
 * accepted with \r\n as with \n, however the bytes arrive. */
START_TEST(line_at_limit_crlf)
{
    const char *bytes = "12345\r\n123456\r\n1234\r\r\nz\r\n";
    for (size_t chunk = 1; chunk <= strlen(bytes); chunk++) {
        char out[256];
        struct ld_framer f = {.max_bytes = 5};
        feed(&f, bytes, strlen(bytes), chunk, out, sizeof(out));
        ck_assert_msg(strcmp(out, "L:12345|T|L:1234\r|L:z|") == 0,
                      "chunk %zu: %s", chunk, out);
    }
}
END_TEST

/* Lines around the limit, with \n and \r\n, empty ones and a stray \r,
 * framed from reads of every size up to a few lines: reading in place
 * and keeping the rest of a read agree with the buffered framer. */
START_TEST(fresh_reads_like_buffered)
{
    char bytes[2048];
    size_t len = 0;
    unsigned seed = 7;
    while (len < sizeof(bytes) - 32) {
        seed = seed * 1103515245u + 12345u;
        size_t n = (seed >> 16) % 24;
        for (size_t i = 0; i < n; i++) {
            bytes[len++] = (char)('a' + (i % 26));
        }
        if ((seed >> 8) % 5 == 0) {
            bytes[len++] = '\r';
        }
        bytes[len++] = '\n';
    }
    bytes[len] = '\0';
    for (size_t chunk = 1; chunk <= 64; chunk++) {
        char out[8192];
        struct ld_framer f = {.max_bytes = 12};
        feed(&f, bytes, len, chunk, out, sizeof(out));
        ck_assert_ptr_nonnull(strstr(out, "T|"));
        ck_assert_ptr_nonnull(strstr(out, "L:|"));
    }
}
END_TEST

static int
parse(const char *line, json_t **body, json_t **id, char *msg)
{
    return ld_proto_parse(line, strlen(line), body, id, msg, 256);
}

START_TEST(parse_good)
{
    json_t *body, *id;
    char msg[256];
    ck_assert_int_eq(parse("{\"op\":\"ping\",\"id\":\"x\"}", &body, &id, msg),
                     LD_OK);
    ck_assert_str_eq(json_string_value(id), "x");
    ck_assert_str_eq(json_string_value(json_object_get(body, "op")), "ping");
    json_decref(body);
    json_decref(id);
}
END_TEST

START_TEST(parse_errors_name_the_field)
{
    static const struct {
        const char *line;
        const char *msg_part;
        bool has_id;
    } cases[] = {
        {"{bad", "invalid JSON", false},
        {"[1,2]", "JSON object", false},
        {"42", "invalid JSON", false},
        {"\"op\"", "invalid JSON", false},
        {"{\"id\":3}", "'op'", true},
        {"{\"id\":3,\"op\":7}", "'op'", true},
        {"{\"id\":[1],\"op\":\"ping\"}", "'id'", false},
        {"{\"op\":\"ping\",\"k\":\"\xc3\x28\"}", "invalid JSON", false},
        {"{\"op\":\"ping\"} trailing", "invalid JSON", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *body = NULL, *id = NULL;
        char msg[256] = "";
        ck_assert_int_eq(parse(cases[i].line, &body, &id, msg), LD_ERR);
        ck_assert_ptr_null(body);
        ck_assert_msg(strstr(msg, cases[i].msg_part) != NULL,
                      "case %zu: message '%s' lacks '%s'", i, msg,
                      cases[i].msg_part);
        ck_assert_int_eq(id != NULL, cases[i].has_id);
        if (id != NULL) {
            json_decref(id);
        }
    }
}
END_TEST

START_TEST(parse_nul)
{
    json_t *body = NULL, *id = NULL;
    char msg[256] = "";
    /* A raw NUL between tokens is not JSON. */
    static const char raw[] = "{\"op\":\"ping\",\"id\":1\0}";
    ck_assert_int_eq(ld_proto_parse(raw, sizeof(raw) - 1, &body, &id, msg,
                                    sizeof(msg)),
                     LD_ERR);
    ck_assert_ptr_null(body);
    ck_assert_msg(strstr(msg, "NUL") != NULL, "message: %s", msg);
    /* \u0000 in a value is data; in op it is refused. */
    ck_assert_int_eq(parse("{\"op\":\"cache.set\",\"value\":\"a\\u0000b\"}",
                           &body, &id, msg),
                     LD_OK);
    ck_assert_uint_eq(json_string_length(json_object_get(body, "value")), 3);
    json_decref(body);
    ck_assert_int_eq(parse("{\"op\":\"ping\\u0000x\"}", &body, &id, msg),
                     LD_ERR);
    ck_assert_msg(strstr(msg, "'op'") != NULL, "message: %s", msg);
    /* Keys keep refusing NUL. */
    ck_assert(!ld_key_valid("a\0b", 3));
}
END_TEST

START_TEST(error_message_cut_at_character)
{
    size_t len = 0;
    /* "é" is two bytes: a message cut after the first of them keeps
     * everything before that character. */
    char *err = ld_proto_error_line(NULL, 0, LD_E_UNKNOWN_OP, NULL,
                                    "op '\xc3\xa9\xc3\xa9\xc3", &len);
    json_t *back = json_loads(err, 0, NULL);
    ck_assert_ptr_nonnull(back);
    ck_assert_str_eq(json_string_value(
                         json_object_get(json_object_get(back, "error"),
                                         "message")),
                     "op '\xc3\xa9\xc3\xa9");
    json_decref(back);
    free(err);
}
END_TEST

START_TEST(reply_lines)
{
    size_t len = 0;
    char *ok = ld_proto_ok_line("7", 1, json_pack("{s:b}", "acquired", 1),
                                &len);
    ck_assert_str_eq(ok, "{\"id\":7,\"ok\":true,\"acquired\":true}\n");
    ck_assert_uint_eq(len, strlen(ok));
    free(ok);
    char *err = ld_proto_error_line("7", 1, LD_E_NOT_HELD,
                                    json_pack("{s:s}", "reason", "other"),
                                    "lock 'k' is not held", &len);
    ck_assert_str_eq(err, "{\"id\":7,\"ok\":false,\"error\":{\"code\":"
                          "\"not_held\",\"message\":\"lock 'k' is not "
                          "held\",\"reason\":\"other\"}}\n");
    free(err);
    /* A message that is not valid UTF-8 still yields a valid line. */
    err = ld_proto_error_line(NULL, 0, LD_E_BAD_REQUEST, NULL, "bad \xff",
                              &len);
    json_t *back = json_loads(err, 0, NULL);
    ck_assert_ptr_nonnull(back);
    json_decref(back);
    free(err);
}
END_TEST

/* ld_json_quote must write exactly what jansson writes for every valid
 * string, and refuse what jansson refuses. */
static void
check_quote_like_jansson(const char *s, size_t len)
{
    char *mine = malloc(ld_json_quote_max(len) + 1);
    size_t n = ld_json_quote(mine, s, len);
    json_t *js = json_stringn(s, len);
    if (js == NULL) {
        ck_assert_msg(n == 0, "accepted what jansson refuses");
    } else {
        char *theirs = json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT);
        ck_assert_msg(n == strlen(theirs) && memcmp(mine, theirs, n) == 0,
                      "ld_json_quote differs: %.*s vs %s", (int)n, mine,
                      theirs);
        free(theirs);
        json_decref(js);
    }
    free(mine);
}

static size_t
put_utf8(unsigned char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Where ld_json_flat_scan answers, its members make json_loadb's tree,
 * key order included, and each string and literal is where the scanner
 * says; it may leave anything to json_loadb, but not the plain requests
 * it exists for. */
static void
check_flat(const char *text, bool must_take)
{
    size_t len = strlen(text);
    struct ld_jmember m[16];
    int n = ld_json_flat_scan(text, len, m, 16);
    json_t *mine = n >= 0 ? ld_json_flat_tree(text, m, n) : NULL;
    for (int k = 0; k < n; k++) {
        ck_assert(m[k].name > 0 && text[m[k].name - 1] == '"' &&
                  text[m[k].name + m[k].name_len] == '"');
        if (m[k].kind == LD_JK_STR) {
            ck_assert(text[m[k].s - 1] == '"' &&
                      text[m[k].s + m[k].len] == '"');
        } else {
            /* The literal's text is the value as jansson writes it. */
            json_t *v = json_object_getn(mine, text + m[k].name,
                                         m[k].name_len);
            char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            ck_assert_msg(strlen(d) == m[k].len &&
                              memcmp(d, text + m[k].s, m[k].len) == 0,
                          "%s: literal %.*s", text, (int)m[k].len,
                          text + m[k].s);
            free(d);
        }
    }
    json_t *theirs = json_loadb(text, len, JSON_ALLOW_NUL, NULL);
    if (must_take) {
        ck_assert_msg(mine != NULL, "flat parse refused %s", text);
    }
    if (mine != NULL) {
        ck_assert_msg(theirs != NULL, "flat parse took invalid %s", text);
        char *a = json_dumps(mine, JSON_COMPACT);
        char *b = json_dumps(theirs, JSON_COMPACT);
        ck_assert_msg(strcmp(a, b) == 0, "%s: %s vs %s", text, a, b);
        free(a);
        free(b);
        json_decref(mine);
    }
    json_decref(theirs);
}

START_TEST(flat_parse_like_jansson)
{
    static const char *taken[] = {
        "{}",
        " {\"op\":\"ping\"} ",
        "{\"op\":\"lock\",\"key\":\"order:42\",\"id\":7,\"wait_ms\":-1}",
        "{\"a\":true,\"b\":false,\"c\":null,\"d\":0,\"e\":-10}",
        "{\"k\":\"\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80\"}",
        "{\"x\":1,\"y\":2,\"x\":3}",
        "\t{ \"n\" : 123456789012345678 ,\r\n\"s\":\"\"}\n",
    };
    static const char *other[] = {
        "",
        "[]",
        "\"s\"",
        "{",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "{\"a\":1 \"b\":2}",
        "{\"a\":1}x",
        "{\"a\":01}",
        "{\"a\":-0}",
        "{\"a\":1.5}",
        "{\"a\":1e3}",
        "{\"a\":-}",
        "{\"a\":1234567890123456789}",
        "{\"a\":99999999999999999999}",
        "{\"a\":\"q\\\"q\"}",
        "{\"a\":\"\\u00e9\"}",
        "{\"a\":\"tab\there\"}",
        "{\"a\":\"\xc0\x80\"}",
        "{\"a\":\"\xe2\x82\"}",
        "{\"a\":{\"b\":1}}",
        "{\"a\":[1]}",
        "{\"a\":tru}",
        "{\"a\":nul}",
        "{\"a\":truex}",
        "{\"\xff\":1}",
    };
    for (size_t i = 0; i < sizeof(taken) / sizeof(taken[0]); i++) {
        check_flat(taken[i], true);
    }
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        check_flat(other[i], false);
    }
    /* Random mutations of a request: whatever the scanner accepts must
     * be what jansson makes of it. */
    static const char base[] =
        "{\"op\":\"lock\",\"key\":\"k1\",\"id\":12,\"detach\":false}";
    static const char alphabet[] = "{}[]\":,-0123456789.eEtrufalsn \\\x01\xc3";
    srand(11);
    for (int round = 0; round < 20000; round++) {
        char buf[sizeof(base)];
        memcpy(buf, base, sizeof(base));
        int edits = 1 + rand() % 3;
        for (int e = 0; e < edits; e++) {
            buf[rand() % (int)(sizeof(base) - 1)] =
                alphabet[rand() % (int)(sizeof(alphabet) - 1)];
        }
        check_flat(buf, false);
    }
}
END_TEST

/* ld_proto_ok_line writes what jansson would for {"id":..,"ok":true,
 * ...fields} whatever the fields hold. */
static void
check_ok_line(json_t *id, json_t *fields)
{
    json_t *obj = json_object();
    if (id != NULL) {
        json_object_set(obj, "id", id);
    }
    json_object_set_new(obj, "ok", json_true());
    json_object_update(obj, fields);
    char *want = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    size_t len = 0;
    char *idt = id != NULL ? json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT)
                           : NULL;
    char *got = ld_proto_ok_line(idt, idt != NULL ? strlen(idt) : 0, fields,
                                 &len);
    free(idt);
    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(len, strlen(want) + 1);
    ck_assert_msg(memcmp(got, want, len - 1) == 0 && got[len - 1] == '\n' &&
                      got[len] == '\0',
                  "ok line differs: %s vs %s", got, want);
    free(got);
    free(want);
}

START_TEST(format_int_like_printf)
{
    static const json_int_t v[] = {0,
                                   1,
                                   -1,
                                   9,
                                   10,
                                   -10,
                                   123456789,
                                   9223372036854775807LL,
                                   -9223372036854775807LL - 1};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char mine[LD_JSON_INT_MAX + 1], want[32];
        size_t n = ld_json_format_int(mine, v[i]);
        mine[n] = '\0';
        snprintf(want, sizeof want, "%" JSON_INTEGER_FORMAT, v[i]);
        ck_assert_str_eq(mine, want);
    }
}
END_TEST

START_TEST(ok_line_like_jansson)
{
    json_t *ids[] = {NULL, json_integer(7), json_string("r\"1\u00e9"),
                     json_null(), json_real(1.5)};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        check_ok_line(ids[i], json_object());
        check_ok_line(
            ids[i],
            json_pack("{s:s,s:I,s:I,s:b,s:b,s:n,s:f,s:{s:i},s:[i,s]}", "token",
                      "ab\\c\n\u20ac", "fence",
                      (json_int_t)9223372036854775807LL, "ttl_ms",
                      (json_int_t)-5, "acquired", 1, "hit", 0, "lease",
                      "ratio", 0.25, "nested", "a", 1, "list", 2, "x"));
        /* Fields named like the head replace it, as json_object_update
         * does. */
        check_ok_line(ids[i], json_pack("{s:b,s:s}", "ok", 0, "k\"ey", "v"));
        check_ok_line(ids[i], json_pack("{s:s}", "id", "other"));
        json_decref(ids[i]);
    }
}
END_TEST

START_TEST(json_quote)
{
    static const struct {
        const char *s;
        size_t len;
    } fixed[] = {
        {"", 0},
        {"plain", 5},
        {"q\"b\\s/", 6},
        {"\n\r\t\b\f", 5},
        {"nul\0in", 6},
        {"\x01\x1f\x7f", 3},
        {"\xc3\xa9t\xc3\xa9", 6},
        {"\xe2\x82\xac", 3},
        {"\xf0\x9f\x98\x80", 4},
        /* refused: overlong, surrogate, above U+10FFFF, bad lead, cut */
        {"\xc0\x80", 2},
        {"\xed\xa0\x80", 3},
        {"\xf4\x90\x80\x80", 4},
        {"\xf5\x80\x80\x80", 4},
        {"\xff", 1},
        {"\xe2\x82", 2},
        {"ok\x80", 3},
    };
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        check_quote_like_jansson(fixed[i].s, fixed[i].len);
    }
    /* Every byte value at every offset of runs long enough for the
     * 16-byte and the word-at-a-time scans, so each lane of each sees
     * each exception. */
    for (size_t len = 8; len <= 56; len += 8) {
        for (size_t at = 0; at < len; at++) {
            for (unsigned c = 0; c < 0x100; c++) {
                char run[56];
                memset(run, 'a', sizeof run);
                run[at] = (char)c;
                check_quote_like_jansson(run, len);
            }
        }
    }
    /* Every single control and ASCII character. */
    for (unsigned c = 1; c < 0x80; c++) {
        char one = (char)c;
        check_quote_like_jansson(&one, 1);
    }
    /* Random strings of random code points, mostly ASCII. */
    srand(7);
    for (int round = 0; round < 2000; round++) {
        unsigned char buf[256];
        size_t len = 0;
        int n = rand() % 40;
        for (int k = 0; k < n; k++) {
            unsigned cp;
            switch (rand() % 4) {
            case 0:
                cp = (unsigned)(rand() % 0x80);
                break;
            case 1:
                cp = 0x80 + (unsigned)(rand() % 0x780);
                break;
            case 2:
                cp = 0x800 + (unsigned)(rand() % 0xf800);
                break;
            default:
                cp = 0x10000 + (unsigned)(rand() % 0x100000);
                break;
            }
            if (cp >= 0xd800 && cp <= 0xdfff) {
                cp = 'x';
            }
            len += put_utf8(buf + len, cp);
        }
        if (rand() % 8 == 0 && len > 0) {
            buf[rand() % len] = (unsigned char)(rand() %
                                                256); /* maybe break it */
        }
        check_quote_like_jansson((const char *)buf, len);
    }
}
END_TEST

START_TEST(error_code_names)
{
    ck_assert_str_eq(ld_errcode_name(LD_E_BAD_REQUEST), "bad_request");
    ck_assert_str_eq(ld_errcode_name(LD_E_REDIS_UNAVAILABLE),
                     "redis_unavailable");
    ck_assert_str_eq(ld_errcode_name(LD_E_SHUTTING_DOWN), "shutting_down");
    ck_assert_str_eq(ld_errcode_name(LD_E__COUNT), "internal");
}
END_TEST

START_TEST(key_limits)
{
    cfg.limits.max_key_bytes = 4;
    ck_assert(ld_key_valid("abcd", 4));
    ck_assert(!ld_key_valid("abcde", 5));
    ck_assert(!ld_key_valid("", 0));
}
END_TEST

int
main(void)
{
    Suite *s = suite_create("frame");
    TCase *tc = tcase_create("frame");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, split_reads);
    tcase_add_test(tc, several_per_read_and_crlf);
    tcase_add_test(tc, partial_line_waits);
    tcase_add_test(tc, oversize_line_skipped);
    tcase_add_test(tc, oversize_line_head_kept);
    tcase_add_test(tc, line_at_limit_accepted);
    tcase_add_test(tc, line_at_limit_crlf);
    tcase_add_test(tc, fresh_reads_like_buffered);
    tcase_add_test(tc, parse_nul);
    tcase_add_test(tc, error_message_cut_at_character);
    tcase_add_test(tc, parse_good);
    tcase_add_test(tc, parse_errors_name_the_field);
    tcase_add_test(tc, reply_lines);
    tcase_add_test(tc, error_code_names);
    tcase_add_test(tc, json_quote);
    tcase_add_test(tc, ok_line_like_jansson);
    tcase_add_test(tc, format_int_like_printf);
    tcase_add_test(tc, flat_parse_like_jansson);
    tcase_add_test(tc, key_limits);
    suite_add_tcase(s, tc);
    return ld_unit_run(s);
}
