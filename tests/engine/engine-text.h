/* SPDX-License-Identifier: MIT */
/*
 * The stand-in's tokenizer and chat template, a toy defined here (README.md, "Text and chat"):
 * text is encoded byte by byte (token id = byte value, UTF-8), the chat template is ChatML's
 * (Qwen's: <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, then <|im_start|>assistant\n),
 * and every generated id decodes on its own to a fixed ASCII piece, so the pieces of a stream
 * concatenate to the whole text and a continuation decodes exactly as it would have in one run
 * (a real tokenizer's pieces can depend on their neighbours: README.md says what that means
 * for a resumed chat).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

#define TEXT_IM_START  256u
#define TEXT_IM_END    257u
#define TEXT_ENDOFTEXT 258u
#define TEXT_VOCAB_MIN 259u /* a model with fewer ids has no tokenizer */
#define TEXT_PIECE_MAX 16   /* the longest piece, its NUL included */

/* Appends the bytes of s[0..n) as ids to out (cap ids at most). -E2BIG past cap. */
int text_encode(const char *s, size_t n, uint32_t *out, size_t cap, size_t *len);
/* The piece of one id into buf (NUL-terminated); its length. Special ids are "" when skip. */
size_t text_piece(uint32_t id, bool skip_special, char buf[static TEXT_PIECE_MAX]);
/* The pieces of ids[0..n) concatenated (malloc'ed), NULL on ENOMEM. */
char *text_decode(const uint32_t *ids, size_t n, bool skip_special);
/* The chat template applied to messages (OpenAI's list of {role, content, name?}; content a
 * string, null, or a list of {"type": "text", "text"} parts) into out (cap ids).
 * 0; -EINVAL with err set (a 400); -E2BIG past cap. */
int text_chat_prompt(json_object *messages, bool add_generation_prompt, uint32_t *out, size_t cap,
		     size_t *len, char *err, size_t errcap);
