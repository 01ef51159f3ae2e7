/* Fuzz target: the HTTP/1.1 request head parser. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct http_request req;
	enum http_parse_result r =
		http_parse_request((const char *)data, size, &req);
	if (r == HTTP_PARSE_OK &&
	    (req.head_len > size || strlen(req.path) >= sizeof(req.path)))
		abort();
	return 0;
}
