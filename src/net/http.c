/* http.c - the request heads a proxy client sends: CONNECT host:port for a tunnel, an
 * absolute-form http:// request otherwise. Only what the proxy needs is read (the target,
 * where the path and the header lines are); header lines are checked for shape, not meaning. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

static int bad(struct conch_err *err, int code, const char *what)
{
    return conch_err_setk(err, CONCH_ERR_USAGE, code, "%s", what);
}

/* The end of the head (after "\r\n\r\n", a bare "\n\n" accepted), or 0. */
static size_t head_end(const char *buf, size_t len)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if (buf[i] != '\n')
            continue;
        if (buf[i + 1] == '\n')
            return i + 2;
        if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

/* host[:port] or [v6][:port] of @s (@len bytes) into @r; @port_default when none. */
static int authority(const char *s, size_t len, uint16_t port_default, struct conch_net_request *r)
{
    const char *host = s, *port = NULL;
    size_t hlen = len, plen = 0;
    if (len && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close)
            return -1;
        host = s + 1;
        hlen = (size_t)(close - host);
        if ((size_t)(close - s) + 1 < len) {
            if (close[1] != ':')
                return -1;
            port = close + 2;
            plen = len - (size_t)(port - s);
        }
    } else {
        const char *colon = memchr(s, ':', len);
        if (colon) {
            hlen = (size_t)(colon - s);
            port = colon + 1;
            plen = len - hlen - 1;
        }
    }
    if (hlen && host[hlen - 1] == '.')
        hlen--;
    if (hlen == 0 || hlen > CONCH_NET_NAME_MAX)
        return -1;
    for (size_t i = 0; i < hlen; i++) {
        unsigned char c = (unsigned char)host[i];
        if (!(isalnum(c) || c == '-' || c == '.' || c == '_' || (c == ':' && s[0] == '[')))
            return -1;
        r->host[i] = (char)tolower(c);
    }
    r->host[hlen] = '\0';
    if (!port) {
        r->port = port_default;
        return port_default ? 0 : -1;
    }
    unsigned v = 0;
    if (plen == 0 || plen > 5)
        return -1;
    for (size_t i = 0; i < plen; i++) {
        if (!isdigit((unsigned char)port[i]))
            return -1;
        v = v * 10 + (unsigned)(port[i] - '0');
    }
    if (v < 1 || v > 65535)
        return -1;
    r->port = (uint16_t)v;
    return 0;
}

int conch_net_request_parse(const char *buf, size_t len, struct conch_net_request *ret,
                            struct conch_err *err)
{
    size_t end = head_end(buf, len < CONCH_NET_HEAD_MAX ? len : CONCH_NET_HEAD_MAX);
    if (!end)
        return len >= CONCH_NET_HEAD_MAX ? bad(err, E2BIG, "request head too long") : 0;
    struct conch_net_request r;
    memset(&r, 0, sizeof(r));
    r.head_len = end;
    const char *eol = memchr(buf, '\n', end);
    size_t line_len = (size_t)(eol - buf);
    if (line_len && buf[line_len - 1] == '\r')
        line_len--;
    /* METHOD SP target SP HTTP/1.x */
    const char *sp1 = memchr(buf, ' ', line_len);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', line_len - (size_t)(sp1 + 1 - buf)) : NULL;
    if (!sp1 || !sp2 || sp1 == buf || (size_t)(sp1 - buf) >= sizeof(r.method) || sp2 == sp1 + 1)
        return bad(err, EINVAL, "malformed request line");
    for (const char *p = buf; p < sp1; p++)
        if (!isupper((unsigned char)*p))
            return bad(err, EINVAL, "malformed request method");
    memcpy(r.method, buf, (size_t)(sp1 - buf));
    const char *ver = sp2 + 1;
    size_t ver_len = line_len - (size_t)(ver - buf);
    if (ver_len != 8 || memcmp(ver, "HTTP/1.", 7) || (ver[7] != '0' && ver[7] != '1'))
        return bad(err, EINVAL, "not an HTTP/1.x request");
    r.version_off = (size_t)(ver - buf);
    const char *target = sp1 + 1;
    size_t tlen = (size_t)(sp2 - target);
    for (size_t i = 0; i < tlen; i++)
        if ((unsigned char)target[i] <= ' ' || target[i] == 0x7f)
            return bad(err, EINVAL, "malformed request target");
    /* Header lines: each "name: value", no bare CR, no NUL, no obsolete folding. */
    r.headers_off = (size_t)(eol + 1 - buf);
    r.headers_len = end - r.headers_off;
    for (size_t i = r.headers_off; i < end;) {
        const char *nl = memchr(buf + i, '\n', end - i);
        size_t l = (size_t)(nl - (buf + i));
        if (l && buf[i + l - 1] == '\r')
            l--;
        if (l == 0)
            break;
        const char *colon = memchr(buf + i, ':', l);
        if (!colon || colon == buf + i)
            return bad(err, EINVAL, "malformed header line");
        /* The name is a token (RFC 9110 5.1): "Connection : x" passed on would make a
         * lenient server stop reading the head before our Host and Connection: close. */
        for (const char *q = buf + i; q < colon; q++)
            if (!*q || (!isalnum((unsigned char)*q) && !strchr("!#$%&'*+-.^_`|~", *q)))
                return bad(err, EINVAL, "malformed header line");
        for (size_t k = 0; k < l; k++)
            if (buf[i + k] == '\0' || buf[i + k] == '\r')
                return bad(err, EINVAL, "malformed header line");
        i = (size_t)(nl + 1 - buf);
    }
    if (!strcmp(r.method, "CONNECT")) {
        r.connect = true;
        if (authority(target, tlen, 0, &r) < 0)
            return bad(err, EINVAL, "CONNECT needs host:port");
    } else {
        if (tlen >= 8 && !strncasecmp(target, "https://", 8))
            return bad(err, EPROTONOSUPPORT,
                       "https:// requests go through CONNECT (set HTTPS_PROXY, not a URL)");
        if (tlen < 8 || strncasecmp(target, "http://", 7))
            return bad(err, EPROTONOSUPPORT,
                       "this is a proxy: send absolute-form requests (http://host/path) or "
                       "CONNECT host:port");
        const char *auth = target + 7;
        size_t rest = tlen - 7;
        const char *slash = memchr(auth, '/', rest);
        const char *q = memchr(auth, '?', rest);
        if (q && (!slash || q < slash))
            slash = q;
        size_t alen = slash ? (size_t)(slash - auth) : rest;
        if (memchr(auth, '@', alen))
            return bad(err, EINVAL, "user information in a proxy request target is refused");
        if (authority(auth, alen, 80, &r) < 0)
            return bad(err, EINVAL, "malformed host in the request target");
        r.path_off = slash ? (size_t)(slash - buf) : 0;
        r.path_len = slash ? tlen - 7 - alen : 0;
    }
    *ret = r;
    return 1;
}
