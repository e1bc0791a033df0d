/* The ByteLevel byte <-> character map (GPT-2's bytes_to_unicode): the 188
 * printable bytes stand for themselves, the other 68 are moved to U+0100
 * and up, so every byte string becomes printable text without spaces. */
#include "tok_internal.h"

static int printable(int b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

void tp_tok_bytelevel_tables(tp_tokenizer *t)
{
    for (int i = 0; i < 512; i++) t->char_byte[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int cp = printable(b) ? b : 256 + extra++;
        t->char_byte[cp] = (int16_t)b;
        if (cp < 0x80) {
            t->byte_char[b][0] = (char)cp;
            t->byte_char_len[b] = 1;
        } else {
            t->byte_char[b][0] = (char)(0xC0 | (cp >> 6));
            t->byte_char[b][1] = (char)(0x80 | (cp & 0x3F));
            t->byte_char_len[b] = 2;
        }
    }
}
