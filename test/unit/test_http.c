/*
 * Mirror test of src/http/http.c's request parser.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "http/http.h"

static enum http_parse_result parse(const char *s, struct http_request *r)
{
	return http_parse_request(s, strlen(s), r);
}

Test(http_parse, simple_get)
{
	struct http_request r;
	const char *s = "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\nNEXT";
	cr_assert_eq(parse(s, &r), HTTP_PARSE_OK);
	cr_assert_str_eq(r.method, "GET");
	cr_assert_str_eq(r.path, "/metrics");
	cr_assert_eq(r.minor_version, 1);
	cr_assert(r.keep_alive);
	cr_assert_eq(r.head_len, strlen(s) - 4);
}

Test(http_parse, connection_and_versions)
{
	struct http_request r;
	cr_assert_eq(parse("GET / HTTP/1.0\r\n\r\n", &r), HTTP_PARSE_OK);
	cr_assert(!r.keep_alive);
	cr_assert_eq(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &r),
		     HTTP_PARSE_OK);
	cr_assert(r.keep_alive);
	cr_assert_eq(parse("GET / HTTP/1.1\r\nconnection:close\r\n\r\n", &r), HTTP_PARSE_OK);
	cr_assert(!r.keep_alive);
	cr_assert_eq(parse("GET / HTTP/1.1\nHost: x\n\n", &r), HTTP_PARSE_OK,
		     "bare LF tolerated");
	cr_assert_eq(parse("\r\nGET / HTTP/1.1\r\n\r\n", &r), HTTP_PARSE_OK,
		     "leading blank line tolerated");
	cr_assert_eq(parse("GET / HTTP/1.1\r\nContent-Length: 12\r\n\r\n", &r), HTTP_PARSE_OK);
	cr_assert_eq(r.content_length, 12);
}

Test(http_parse, incomplete_until_blank_line)
{
	struct http_request r;
	const char *full = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n";
	for (size_t n = 0; n < strlen(full); n++)
		cr_assert_eq(http_parse_request(full, n, &r), HTTP_PARSE_INCOMPLETE,
			     "prefix %zu", n);
	cr_assert_eq(http_parse_request(full, strlen(full), &r), HTTP_PARSE_OK);
}

Test(http_parse, malformed)
{
	const char *bad[] = {
		"GET\r\n\r\n",
		"GET /\r\n\r\n",
		"get / HTTP/1.1\r\n\r\n",
		"GET / HTTP/2.0\r\n\r\n",
		"GET / HTTP/1.1x\r\n\r\n",
		"GET  HTTP/1.1\r\n\r\n",
		"GET /a\x01 HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
		"GET / HTTP/1.1\r\n: empty\r\n\r\n",
		"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
		"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
		"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
		"GET / HTTP/1.1\r\nContent-Length: 9999999999999999999\r\n\r\n",
		"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
		"VERYLONGMETHODNAMEXX / HTTP/1.1\r\n\r\n",
	};
	struct http_request r;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(parse(bad[i], &r), HTTP_PARSE_BAD, "case %zu", i);
}

Test(http_parse, too_large)
{
	static char big[HTTP_MAX_HEAD + 100];
	struct http_request r;
	memset(big, 'a', sizeof(big));
	memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
	cr_assert_eq(http_parse_request(big, sizeof(big), &r), HTTP_PARSE_TOO_LARGE);
	char path[400] = "GET /";
	memset(path + 5, 'p', 300);
	strcpy(path + 305, " HTTP/1.1\r\n\r\n");
	cr_assert_eq(parse(path, &r), HTTP_PARSE_BAD, "target longer than 255");
}
