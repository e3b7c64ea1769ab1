/* test_fences.c - unit tests for the fences module (being written). */
#include <criterion/criterion.h>

Test(fences, placeholder_until_the_module_lands)
{
    cr_assert(1 + 1 == 2);
}
